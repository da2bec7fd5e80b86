"""Launch lines and sbatch scripts: how many GPUs a job runs on (and which, when sbatch names
the GPU type), read from the launcher's own flags.

torchrun / `python -m torch.distributed.run` (torch/distributed/run.py: `--nnodes` default 1,
`--nproc-per-node` default 1, both spellings `--nproc_per_node`), `deepspeed --num_gpus N
--num_nodes M` (deepspeed/launcher/runner.py), `accelerate launch --num_processes N` (the total
over every machine, accelerate/commands/launch.py), `tune run --nproc_per_node N --nnodes M`,
`litgpt ... --devices N --num_nodes M`, `NNODES=M NPROC_PER_NODE=N llamafactory-cli train`
(llamafactory/cli.py), `srun` / `mpirun -np N` running one process per task, and `#SBATCH`
headers (--nodes, --ntasks-per-node, --gpus-per-node, --gres=gpu[:TYPE]:N, --gpus): num_gpus =
nodes x processes per node; gpu when the sbatch TYPE names a trainmem GPU profile.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._reading import Doc, Reading
from ._shell import Command, Script, known, parse_script, sbatch_options
from ._stacks import Stack

TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
PYTHONS = re.compile(r"^python(\d(\.\d+)?)?$")
SRUN_VALUE_OPTIONS = {"-N", "-n", "-c", "-G", "-p", "-o", "-e", "-J", "-t", "-w", "-A", "-q"}


def _base(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _options(words: Sequence[str]) -> dict[str, str]:
    """`--flag value` / `--flag=value` pairs of a launcher's words (a flag with no value: "")."""
    out: dict[str, str] = {}
    k = 0
    while k < len(words):
        word = words[k]
        k += 1
        if not word.startswith("-"):
            continue
        name, eq, value = word.partition("=")
        if not eq and k < len(words) and not words[k].startswith("-"):
            value, k = words[k], k + 1
        out[name] = value
    return out


def _pick(options: dict[str, str], *names: str) -> tuple[str, str] | None:
    """The first of `names` given (its spelling, its value)."""
    for name in names:
        if name in options:
            return name, options[name]
    return None


SRUN_SWITCHES = {"--exclusive", "--overcommit", "--label", "--pty", "--unbuffered", "--no-kill",
                 "--kill-on-bad-exit", "--verbose", "--quiet", "-l", "-u", "-K", "-v",
                 "-Q"}  # fmt: skip
COMMANDS = re.compile(
    r"^(python[\d.]*|torchrun|bash|sh|accelerate|deepspeed|tune|litgpt|"
    r"llamafactory-cli|numactl|env|singularity|apptainer)$"
)


def strip_srun(argv: list[str]) -> tuple[list[str], list[str]]:
    """(srun's own words, the command it runs) of an `srun ... CMD` line (else ([], argv))."""
    if not argv or _base(argv[0]) != "srun":
        return [], argv
    k = 1
    while k < len(argv) and argv[k].startswith("-"):
        word = argv[k]
        takes = word in SRUN_VALUE_OPTIONS or (
            word.startswith("--") and "=" not in word and word not in SRUN_SWITCHES
        )
        nxt = argv[k + 1] if k + 1 < len(argv) else ""
        k += 2 if takes and not nxt.startswith("-") and not COMMANDS.match(_base(nxt)) else 1
    return argv[:k], argv[k:]


def torchrun_args(argv: list[str]) -> tuple[list[str], int] | None:
    """torchrun's own words and the index of what it runs (the script, or `-m`), for a
    torchrun or `python -m torch.distributed.run` command; None otherwise."""
    if not argv:
        return None
    start = None
    if _base(argv[0]) == "torchrun":
        start = 1
    elif PYTHONS.match(_base(argv[0])):
        for k in range(1, len(argv) - 1):
            if argv[k] == "-m" and argv[k + 1] in TORCHRUN_MODULES:
                start = k + 2
                break
            if not argv[k].startswith("-"):
                break
    if start is None:
        return None
    k = start
    while k < len(argv) and argv[k].startswith("-") and argv[k] != "-m":
        has_value = "=" not in argv[k] and argv[k] not in (
            "--standalone",
            "--no-python",
            "--no_python",
            "--run-path",
        )
        k += 2 if has_value else 1
    return argv[start:k], k


def _count(value: str, doc: Doc, key: str, reading: Reading) -> int | None:
    """A launcher's count (`8`, `1:4` elastic: the largest); None (warned) when the script
    leaves it unknown."""
    text = value.strip().strip("'\"")
    if not known(text) or not text:
        reading.warn(
            f"{doc.name}:{key}: set outside the script ({text.replace(chr(0), '$?')!r}); "
            "give --num-gpus"
        )
        return None
    last = text.split(":")[-1]
    if not last.isdigit():
        if text in ("gpu", "auto"):
            return None
        raise ValueError(f"{doc.name}: {key}: expected a process count, got {value!r}")
    return int(last)


def _product(parts: list[tuple[str, str]], doc: Doc, reading: Reading) -> tuple[int, str] | None:
    """num_gpus and its key from (flag, value) factors (nodes, processes per node)."""
    total, keys = 1, []
    for key, value in parts:
        n = _count(value, doc, key, reading)
        if n is None:
            return None
        total *= n
        if n != 1 or len(parts) == 1:
            keys.append(key)
    return total, " x ".join(keys or [parts[-1][0]])


def _torchrun(argv: list[str], script: Script) -> list[tuple[str, str]] | None:
    found = torchrun_args(argv)
    if found is None:
        return None
    options = _options(found[0])
    nproc = _pick(options, "--nproc-per-node", "--nproc_per_node")
    if nproc is not None and nproc[1] in ("gpu", "auto"):
        per_node = _sbatch_gpus_per_node(script)
        nproc = None if per_node is None else (f"#SBATCH {per_node[0]}", per_node[1])
    nodes = _pick(options, "--nnodes")
    return [p for p in (nodes, nproc) if p is not None] if nproc else []


def _named(argv: list[str], command: Command) -> list[tuple[str, str]] | None:
    """deepspeed, accelerate launch, tune run, litgpt, llamafactory-cli, mpirun."""
    name = _base(argv[0]) if argv else ""
    script = next((k for k, w in enumerate(argv) if w.endswith(".py")), len(argv))
    options = _options(argv[1:script])
    if name == "deepspeed":
        gpus = _pick(options, "--num_gpus", "--num-gpus")
        nodes = _pick(options, "--num_nodes", "--num-nodes")
        return [p for p in (nodes, gpus) if p is not None] if gpus else []
    if name == "accelerate" and argv[1:2] == ["launch"]:
        total = _pick(options, "--num_processes", "--num-processes")
        return [total] if total else []
    if name == "tune" and argv[1:2] == ["run"]:
        nproc = _pick(options, "--nproc_per_node", "--nproc-per-node")
        nodes = _pick(options, "--nnodes")
        return [p for p in (nodes, nproc) if p is not None] if nproc else []
    if name == "litgpt":
        devices = _pick(options, "--devices")
        nodes = _pick(options, "--num_nodes", "--num-nodes")
        return [p for p in (nodes, devices) if p is not None] if devices else []
    if name == "llamafactory-cli":
        env = command.env
        if "NPROC_PER_NODE" not in env:
            return []
        return [("NNODES", env.get("NNODES", "1")), ("NPROC_PER_NODE", env["NPROC_PER_NODE"])]
    if name in ("mpirun", "mpiexec"):
        count = _pick(options, "-np", "-n", "--np")
        return [count] if count else []
    return None


def _srun_tasks(srun: list[str], script: Script) -> list[tuple[str, str]]:
    """Processes an srun starts: its -n, else its nodes x tasks per node, else sbatch's."""
    own = sbatch_options(srun[1:])
    header = sbatch_options(script.sbatch)
    for options, where in ((own, "srun"), (header, "#SBATCH")):
        if "ntasks" in options:
            return [(f"{where} --ntasks", options["ntasks"])]
        if "ntasks-per-node" in options:
            nodes = own.get("nodes") or header.get("nodes") or "1"
            return [
                (f"{where} --nodes", nodes.split("-")[0]),
                (f"{where} --ntasks-per-node", options["ntasks-per-node"]),
            ]
    return []


def _sbatch_gpus_per_node(script: Script) -> tuple[str, str] | None:
    options = sbatch_options(script.sbatch)
    for name in ("gpus-per-node", "gres"):
        value = options.get(name)
        if value is None:
            continue
        count = value.split(",")[0].rsplit(":", 1)[-1]
        if name == "gres" and not value.startswith("gpu"):
            continue
        if count.isdigit():
            return f"--{name}", count
    return None


def _sbatch_gpus(script: Script) -> list[tuple[str, str]]:
    options = sbatch_options(script.sbatch)
    per_node = _sbatch_gpus_per_node(script)
    if per_node is not None:
        nodes = options.get("nodes", "1").split("-")[0]
        return [("#SBATCH --nodes", nodes), (f"#SBATCH {per_node[0]}", per_node[1])]
    total = options.get("gpus", "").rsplit(":", 1)[-1]
    return [("#SBATCH --gpus", total)] if total.isdigit() else []


def launch_factors(command: Command, script: Script) -> list[tuple[str, str]] | None:
    """(flag, value) factors of the processes one command launches ([]: a launcher that does
    not say); None when it is no launcher."""
    srun, argv = strip_srun(command.argv)
    for found in (_torchrun(argv, script), _named(argv, command)):
        if found is not None:
            return found
    if srun and argv:
        return _srun_tasks(srun, script)  # srun python ...: one process per task
    return None


def gpus_of(doc: Doc, reading: Reading, script: Script) -> tuple[int, str] | None:
    """num_gpus and the key it is read from: the first launcher's processes, else the GPUs
    sbatch allocates; None when neither says."""
    for command in script.commands:
        factors = launch_factors(command, script)
        if factors is None:
            continue
        if factors:
            return _product(factors, doc, reading)
        break
    factors = _sbatch_gpus(script)
    return _product(factors, doc, reading) if factors else None


GPU_TYPE = re.compile(r"^(?:gpu:)?([A-Za-z][\w.-]*):\d+$")


def gpu_of(script: Script) -> tuple[str, str] | None:
    """(the GPU type sbatch names, the key): `--gres=gpu:h100:8`, `--gpus-per-node=a100:4`."""
    options = sbatch_options(script.sbatch)
    for name in ("gres", "gpus-per-node", "gpus", "gpus-per-task"):
        value = options.get(name, "").split(",")[0]
        m = GPU_TYPE.match(value)
        if m and m.group(1) != "gpu" and (name != "gres" or value.startswith("gpu:")):
            return m.group(1), f"#SBATCH --{name}"
    return None


def read_gpu(doc: Doc, reading: Reading, script: Script) -> None:
    found = gpu_of(script)
    if found is None:
        return
    from trainmem.hardware import load_gpus, resolve_gpu_name

    kind, key = found
    profile = resolve_gpu_name(kind, load_gpus())
    if profile is None:
        reading.warn(f"{doc.name}:{key}: GPU type {kind!r} is no trainmem GPU profile; give --gpu")
        return
    if profile != kind:
        reading.warn(f"gpu: {doc.name}:{key} {kind!r} read as {profile!r}")
    reading.put("gpu", profile, doc, key)


def detect(doc: Doc) -> int:
    """5 for a shell file that launches processes (or asks sbatch for GPUs); a training
    config's own reader scores higher."""
    if doc.syntax != "shell":
        return 0
    script = parse_script(doc.text)
    if any(launch_factors(c, script) is not None for c in script.commands):
        return 5
    return 5 if _sbatch_gpus(script) or gpu_of(script) else 0


ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""The caching allocator's settings (torch c10/cuda/CUDAAllocatorConfig.cpp reads both, the
second since torch 2.9)."""


def read_allocator(doc: Doc, reading: Reading, script: Script) -> None:
    """allocator expandable-segments when the launched command sees
    `expandable_segments:True` in the allocator's settings (what `recommend` exports)."""
    for command in script.commands:
        for name in ALLOC_CONF:
            value = command.env.get(name)
            if isinstance(value, str) and "expandable_segments:true" in value.lower():
                reading.put("allocator", "expandable-segments", doc, name)
                return


def read(doc: Doc, reading: Reading) -> None:
    script = parse_script(doc.text)
    found = gpus_of(doc, reading, script)
    if found is not None:
        reading.put("num_gpus", found[0], doc, found[1])
    read_gpu(doc, reading, script)
    read_allocator(doc, reading, script)


STACK = Stack(
    name="launch",
    version="torch 2.13 (torchrun, srun, deepspeed, accelerate launch)",
    framework="hf",
    detect=detect,
    read=read,
    auxiliary=True,
    selectable=False,
)
