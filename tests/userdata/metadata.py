"""A fake instance metadata service on 127.0.0.1: EC2 IMDSv2 and GCE, plus NVIDIA's apt repo.

EC2 paths answer only with a token from `PUT /latest/api/token` (as with `HttpTokens:
required`), so a script that skips IMDSv2 gets 401. GCE paths answer only with the
`Metadata-Flavor: Google` header. `notice_aws()` / `notice_gce()` start serving a spot
notice; `requests` records what was asked, for assertions.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

INSTANCE_ID = "i-0123456789abcdef0"
GCE_NAME = "trainstack-dev-abcd"
TOKEN = "AQAEAsandbox-token=="
GPG_KEY = b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBFsandbox\n-----END PGP PUBLIC KEY BLOCK-----\n"


class MetadataServer:
    """Serves until `close()`; `url` is its base URL."""

    def __init__(self, *, instance_id: str = INSTANCE_ID, name: str = GCE_NAME, address: str = "10.0.0.10",
                 host: str = "127.0.0.1") -> None:
        self.instance_id, self.name = instance_id, name
        self.instance_action: dict | None = None
        self.rebalance: dict | None = None
        self.gce_preempted = False
        self.gce_maintenance = "NONE"
        self.local_ipv4 = address
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, authorized)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: bytes = b"") -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                ok = self.path == "/latest/api/token" and "X-aws-ec2-metadata-token-ttl-seconds" in self.headers
                server.requests.append(("PUT", self.path, ok))
                self._send(200, TOKEN.encode()) if ok else self._send(400)

            def do_GET(self):
                path = self.path
                if path.startswith("/latest/"):
                    ok = self.headers.get("X-aws-ec2-metadata-token") == TOKEN
                    server.requests.append(("GET", path, ok))
                    if not ok:
                        return self._send(401)
                    return self._aws(path.removeprefix("/latest/meta-data/"))
                if path.startswith("/computeMetadata/v1/"):
                    ok = self.headers.get("Metadata-Flavor") == "Google"
                    server.requests.append(("GET", path, ok))
                    if not ok:
                        return self._send(403)
                    return self._gce(path.removeprefix("/computeMetadata/v1/instance/"))
                server.requests.append(("GET", path, True))
                if path == "/nvidia/gpgkey":
                    return self._send(200, GPG_KEY)
                if path == "/nvidia/stable/deb/nvidia-container-toolkit.list":
                    host = server.url
                    return self._send(200, f"deb {host}/nvidia/stable/deb/$(ARCH) /\n".encode())
                return self._send(404)

            def _aws(self, item: str):
                if item == "instance-id":
                    return self._send(200, server.instance_id.encode())
                if item == "local-ipv4":
                    return self._send(200, server.local_ipv4.encode())
                if item == "spot/instance-action" and server.instance_action:
                    return self._send(200, json.dumps(server.instance_action).encode())
                if item == "events/recommendations/rebalance" and server.rebalance:
                    return self._send(200, json.dumps(server.rebalance).encode())
                return self._send(404)

            def _gce(self, item: str):
                values = {"name": server.name, "preempted": "TRUE" if server.gce_preempted else "FALSE",
                          "maintenance-event": server.gce_maintenance,
                          "network-interfaces/0/ip": server.local_ipv4}
                if item in values:
                    return self._send(200, values[item].encode())
                return self._send(404)

        # Each sandbox machine has its own metadata service, on its own loopback address.
        self._httpd = ThreadingHTTPServer((host, 0), Handler)
        self.port = self._httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def notice_aws(self) -> None:
        """Start serving a spot interruption notice, two minutes ahead, as EC2 does."""
        self.instance_action = {"action": "terminate", "time": "2026-01-01T00:02:00Z"}

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
