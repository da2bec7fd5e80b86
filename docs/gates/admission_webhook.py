"""A Kubernetes validating admission webhook that refuses a training job that will not fit.

The job carries its own config files in one annotation, `trainmem.io/config` (a JSON object:
file name -> text, e.g. a torchtune recipe, or an HF config with its DeepSpeed JSON), and
optionally `trainmem.io/fleet` (`8xh100-sxm-80gb`: the pool it will run on). The webhook sends
them to `trainmem serve` (POST /v1/check) and answers the AdmissionReview: allowed when the job
fits, refused with the peak, the usable memory and the smallest fix when not. Objects without
the annotation are allowed untouched. Standard library only.

    python admission_webhook.py --port 8443 --trainmem http://127.0.0.1:8000 \
        [--certfile tls.crt --keyfile tls.key]

The API server calls webhooks over TLS: give the certificate (a ValidatingWebhookConfiguration
whose clientConfig.caBundle signs it, rules on the job kinds you run: batch/v1 jobs,
kubeflow.org/v1 pytorchjobs, ...). `failurePolicy: Ignore` keeps jobs flowing if trainmem is
down; this webhook itself answers "allowed" with a warning when the service cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import ssl
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONFIG_ANNOTATION = "trainmem.io/config"
FLEET_ANNOTATION = "trainmem.io/fleet"
GIB = 2**30


def review(request: dict[str, Any], trainmem_url: str) -> dict[str, Any]:
    """The AdmissionReview response (admission.k8s.io/v1) to one AdmissionReview request."""
    uid = request.get("request", {}).get("uid", "")
    obj = request.get("request", {}).get("object") or {}
    annotations = obj.get("metadata", {}).get("annotations") or {}
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if CONFIG_ANNOTATION in annotations:
        response.update(_verdict(annotations, trainmem_url))
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _verdict(annotations: dict[str, str], trainmem_url: str) -> dict[str, Any]:
    try:
        files = json.loads(annotations[CONFIG_ANNOTATION])
    except json.JSONDecodeError:
        return _refuse(f"{CONFIG_ANNOTATION}: not a JSON object of file name -> text", 400)
    body: dict[str, Any] = {"files": files, "fix": True}
    if FLEET_ANNOTATION in annotations:
        body["fleet"] = annotations[FLEET_ANNOTATION]
    try:
        answer = _post(f"{trainmem_url}/v1/check", body)
    except (OSError, ValueError) as exc:
        return {"allowed": True, "warnings": [f"trainmem: no answer ({exc}); not checked"]}
    if "fits" not in answer:
        return _refuse(f"trainmem: {answer.get('error', 'bad request')}", 400)
    peak = answer["peak_device_bytes"] / GIB
    gpu = answer["gpu"]
    if answer["fits"]:
        return {"allowed": True, "warnings": [f"trainmem: fits, peak {peak:.2f} GiB per GPU"]}
    usable = gpu["usable_bytes"] * (1 - answer["headroom"]) / GIB
    fix = answer.get("fix") or {}
    edits = "; ".join(f"{e['key']}: {e['from']} -> {e['to']}" for e in fix.get("edits", []))
    message = f"trainmem: does not fit, peak {peak:.2f} GiB > {usable:.2f} GiB on {gpu['name']}"
    return _refuse(message + (f"; fix: {edits}" if edits else ""), 403)


def _refuse(message: str, code: int) -> dict[str, Any]:
    return {"allowed": False, "status": {"code": code, "message": message}}


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:  # 422: the files are bad input
        return json.loads(exc.read() or b"{}")


def make_handler(trainmem_url: str) -> type[BaseHTTPRequestHandler]:
    """The request handler: each POST is one AdmissionReview, answered by `review`."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("content-length") or 0)
            try:
                request = json.loads(self.rfile.read(length))
                answer = review(request, trainmem_url)
            except json.JSONDecodeError:
                self.send_error(400, "body: not an AdmissionReview")
                return
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def main() -> None:
    """Serve the webhook (plain HTTP, or TLS with --certfile/--keyfile)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--trainmem", default="http://127.0.0.1:8000")
    parser.add_argument("--certfile")
    parser.add_argument("--keyfile")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.trainmem))
    if args.certfile:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.certfile, args.keyfile)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
