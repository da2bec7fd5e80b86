#!/usr/bin/env bash
# sbatch with a memory gate: the job's config files go to `trainmem serve` (POST /v1/check)
# before sbatch sees them; a job that will not fit its GPUs is refused, with the reason and the
# smallest fix, and never queued.
#
#   sbatch-gate.sh [--fleet 8xh100] CONFIG [CONFIG ...] -- [sbatch options] SCRIPT [args]
#
# TRAINMEM_URL (default http://127.0.0.1:8000) is the service; SBATCH (default sbatch) the
# command run when the job fits. Needs curl and python3 (to build and read the JSON).
# Exit codes: sbatch's own when it fits; 1 does not fit; 2 bad input or no answer.
set -euo pipefail
url="${TRAINMEM_URL:-http://127.0.0.1:8000}"
fleet=""
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fleet) fleet="$2"; shift 2 ;;
    --) shift; break ;;
    *) files+=("$1"); shift ;;
  esac
done
if [ ${#files[@]} -eq 0 ] || [ $# -eq 0 ]; then
  echo "usage: sbatch-gate.sh [--fleet POOL] CONFIG... -- [sbatch options] SCRIPT" >&2
  exit 2
fi
# The request: {"files": {NAME: TEXT}, "fix": true[, "fleet": POOL]}.
body=$(python3 - "$fleet" "${files[@]}" <<'PY'
import json, os, sys
fleet, paths = sys.argv[1], sys.argv[2:]
files = {}
for path in paths:
    with open(path, encoding="utf-8") as f:
        files[os.path.basename(path)] = f.read()
request = {"files": files, "fix": True}
if fleet:
    request["fleet"] = fleet
print(json.dumps(request))
PY
)
answer=$(curl -sS -X POST -H 'content-type: application/json' --data-binary "$body" \
  "$url/v1/check") || { echo "sbatch-gate: no answer from $url" >&2; exit 2; }
verdict=$(python3 -c '
import json, sys
a = json.loads(sys.stdin.read())
if "fits" not in a:
    print("bad:" + a.get("error", "unexpected answer"))
elif a["fits"]:
    print("fits:peak %.2f GiB of %s" % (a["peak_device_bytes"] / 2**30, a["gpu"]["name"]))
else:
    fix = a.get("fix") or {}
    edits = "; ".join("%s %s -> %s" % (e["key"], e["from"], e["to"]) for e in fix.get("edits", []))
    print("no:peak %.2f GiB, %.2f GiB usable on %s%s" % (
        a["peak_device_bytes"] / 2**30, a["gpu"]["usable_bytes"] / 2**30 * (1 - a["headroom"]),
        a["gpu"]["name"], "; fix: " + edits if edits else ""))
' <<<"$answer")
case "$verdict" in
  fits:*) echo "sbatch-gate: fits (${verdict#fits:})" >&2; exec "${SBATCH:-sbatch}" "$@" ;;
  no:*) echo "sbatch-gate: refused, the job does not fit (${verdict#no:})" >&2; exit 1 ;;
  *) echo "sbatch-gate: ${verdict#bad:}" >&2; exit 2 ;;
esac
