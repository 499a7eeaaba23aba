"""A small fake Kubernetes API server on 127.0.0.1: the few calls `ops` makes of a Job stack's cluster
(ops/kube.py), answered from the fake Job controller's state (tests/components/kubernetes/fake_controller.py).

Served, as the API spells them: GET /version, the nodes, a namespace and a ServiceAccount (what preflight
reads), GET a pod, GET a Job's status, PATCH a Job (merge patch: what `ops stop` sends), DELETE a
Job (its propagationPolicy kept), POST or PUT a Deployment, Service or NetworkPolicy (serving's), GET the pods by label selector (`job-name=<job>`), GET a pod's log (the
container named); everything else is a 404 Status. Every request is recorded (method, path, query, headers,
body) for the tests to assert on what the client sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.components.kubernetes.fake_controller import FakeJob, Pod

CREATED = "2026-12-01T00:00:{:02d}Z"


class FakeKubeAPI:
    """One namespace with one Job (a FakeJob) and its pods, dead ones kept as the API keeps Failed pods."""

    def __init__(self, namespace: str, job: FakeJob, *, token: str = "t0ken"):
        self.namespace, self.job, self.token = namespace, job, token
        self.deleted: dict[str, Any] | None = None
        self.ended: list[Pod] = []  # terminal pods the controller has replaced
        self.logs: dict[tuple[str, str], str] = {}  # (pod, container) -> text
        self.requests: list[dict[str, Any]] = []
        # Called with (pod, container, follow) before a log is served: a test changes the log, or ends the pod,
        # between one connection and the next. A followed log is served as it stands, then the stream closes.
        self.on_log: Callable[[str, str, bool], None] | None = None
        self.applied: dict[tuple[str, str], dict[str, Any]] = {}  # (collection path, name) -> object
        self._order: dict[str, int] = {}
        # What preflight reads: the server's version, the nodes, namespaces by name, ServiceAccounts by (ns, name).
        self.version = {"major": "1", "minor": "33", "gitVersion": "v1.33.2", "gitCommit": "0" * 40,
                        "gitTreeState": "clean", "buildDate": "2026-06-17T00:00:00Z", "goVersion": "go1.24.4",
                        "compiler": "gc", "platform": "linux/amd64"}
        self.nodes: list[dict[str, Any]] = []
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.service_accounts: dict[tuple[str, str], dict[str, Any]] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    # -- the objects as the API returns them
    def job_object(self) -> dict[str, Any]:
        m = self.job.manifest
        active = 0 if m["spec"].get("suspend") or self.job.finished else len(self.job.pods)
        status = {**self.job.status, "active": active}
        return {"apiVersion": "batch/v1", "kind": "Job", **{"metadata": {**m["metadata"], "namespace": self.namespace}},
                "spec": m["spec"], "status": status}

    def pod_object(self, pod: Pod) -> dict[str, Any]:
        order = self._order.setdefault(pod.name, len(self._order))
        statuses = [{"name": c, "ready": False, "restartCount": 0, "image": "img", "imageID": "",
                     "state": {"terminated": {"exitCode": code}} if code is not None else {"running": {}}}
                    for c, code in pod.exit_codes.items()]
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod.name, "namespace": self.namespace, "creationTimestamp": CREATED.format(order),
                             "labels": {"job-name": self.job.manifest["metadata"]["name"],
                                        "batch.kubernetes.io/job-completion-index": str(pod.index)}},
                "status": {"phase": pod.phase, "conditions": pod.conditions, "containerStatuses": statuses}}

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                                  "reason": reason, "code": code})

            def _route(self, method: str) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                query = parse_qs(url.query)
                api.requests.append({"method": method, "path": url.path, "query": query, "body": body,
                                     "headers": dict(self.headers)})
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._status(401, "Unauthorized", "Unauthorized")
                ns = f"/namespaces/{api.namespace}"
                if method == "GET" and url.path in ("/version", "/version/"):
                    return self._send(200, api.version)
                if method == "GET" and url.path == "/api/v1/nodes":
                    return self._send(200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": api.nodes})
                parts = url.path.split("/")
                if method == "GET" and len(parts) == 5 and url.path.startswith("/api/v1/namespaces/"):
                    if parts[4] in api.namespaces:
                        return self._send(200, api.namespaces[parts[4]])
                    return self._status(404, "NotFound", f'namespaces "{parts[4]}" not found')
                if method == "GET" and len(parts) == 7 and parts[5] == "serviceaccounts":
                    if (parts[4], parts[6]) in api.service_accounts:
                        return self._send(200, api.service_accounts[(parts[4], parts[6])])
                    return self._status(404, "NotFound", f'serviceaccounts "{parts[6]}" not found')
                name = api.job.manifest["metadata"]["name"]
                job_path = f"/apis/batch/v1{ns}/jobs/{name}"
                exists = api.deleted is None
                if url.path in (job_path, job_path + "/status") and exists:
                    if method == "GET":
                        return self._send(200, api.job_object())
                    if method == "PATCH" and url.path == job_path:
                        spec = (body or {}).get("spec", {})
                        api.job.manifest["spec"].update(spec)
                        return self._send(200, api.job_object())
                    if method == "DELETE" and url.path == job_path:
                        api.deleted = body or {}
                        return self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                collections = (f"/apis/apps/v1{ns}/deployments", f"/api/v1{ns}/services",
                                   f"/apis/networking.k8s.io/v1{ns}/networkpolicies")
                if method == "POST" and url.path in collections:
                    key = (url.path, body["metadata"]["name"])
                    if key in api.applied:
                        return self._status(409, "AlreadyExists", f"{key[1]} already exists")
                    api.applied[key] = body
                    return self._send(201, body)
                base, _, obj = url.path.rpartition("/")
                if method == "PUT" and base in collections:
                    if (base, obj) not in api.applied:
                        return self._status(404, "NotFound", f"{obj} not found")
                    api.applied[(base, obj)] = body
                    return self._send(200, body)
                if url.path.startswith(f"/api/v1{ns}/pods/") and len(parts) == 7 and method == "GET":
                    pods = [] if api.deleted is not None else [*api.ended, *api.job.pods.values()]
                    found = [p for p in pods if p.name == parts[6]]
                    if found:
                        return self._send(200, api.pod_object(found[-1]))
                    return self._status(404, "NotFound", f'pods "{parts[6]}" not found')
                if url.path == f"/api/v1{ns}/pods" and method == "GET":
                    selector = query.get("labelSelector", [""])[0]
                    pods = [] if api.deleted is not None else [*api.ended, *api.job.pods.values()]
                    items = [api.pod_object(p) for p in pods]
                    items = [i for i in items if _selects(selector, i["metadata"]["labels"])]
                    return self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
                if url.path.startswith(f"/api/v1{ns}/pods/") and url.path.endswith("/log") and method == "GET":
                    pod = url.path.split("/")[-2]
                    container = query.get("container", [""])[0]
                    if api.on_log is not None:
                        api.on_log(pod, container, query.get("follow", [""])[0].lower() == "true")
                    if (pod, container) in api.logs:
                        return self._send(200, api.logs[(pod, container)], "text/plain")
                return self._status(404, "NotFound", f"{url.path} not found")

            def do_GET(self) -> None:
                self._route("GET")

            def do_PATCH(self) -> None:
                self._route("PATCH")

            def do_DELETE(self) -> None:
                self._route("DELETE")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PUT(self) -> None:
                self._route("PUT")

        return Handler


def _selects(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors (`a=b,c=d`), what ops sends."""
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True
