"""The fault proxy the store tests rely on: what it does not fail reaches the upstream byte for byte.

Proof first that the proxy itself cannot alter a body or a length, so a wrong result under
faults is the trainer's and not the test rig's.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devtools.fault_proxy import FaultProxy


class _Recorder:
    """An upstream that records each request's headers and raw body, and answers a fixed body."""

    ANSWER = b"0123456789" * 1000

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict, bytes]] = []
        rec = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _raw_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    raw = b""
                    while True:
                        line = self.rfile.readline()
                        raw += line
                        size = int(line.split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while True:  # trailers, up to the blank line
                                line = self.rfile.readline()
                                raw += line
                                if line in (b"\r\n", b"\n", b""):
                                    return raw
                        raw += self.rfile.read(size) + self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n)

            def _answer(self) -> None:
                rec.seen.append((self.command, dict(self.headers.items()), self._raw_body()))
                self.send_response(200)
                self.send_header("Content-Length", str(len(rec.ANSWER)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(rec.ANSWER)

            do_GET = do_PUT = do_HEAD = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream():
    rec = _Recorder()
    yield rec
    rec.close()


def _request(proxy: FaultProxy, method: str, body: bytes | None = None, headers: dict | None = None, *, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.putrequest(method, "/bucket/key")
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        if raw is not None:
            conn.send(raw)
        elif body is not None:
            conn.send(body)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_bodies_and_lengths_pass_unchanged(upstream):
    body = bytes(range(256)) * 41
    chunked = b"5\r\nhello\r\n1a;ext=1\r\n" + b"x" * 26 + b"\r\n0\r\nx-amz-checksum-crc32: AAAAAA==\r\n\r\n"
    with FaultProxy(upstream.url) as proxy:
        assert _request(proxy, "PUT", body, {"Content-Length": str(len(body))})[0] == 200
        status, _, _ = _request(proxy, "PUT", headers={"Transfer-Encoding": "chunked"}, raw=chunked)
        assert status == 200
        status, head_headers, head_body = _request(proxy, "HEAD")
        status_get, get_headers, got = _request(proxy, "GET")
    (m1, h1, b1), (m2, h2, b2) = upstream.seen[:2]
    assert (m1, b1, h1["Content-Length"]) == ("PUT", body, str(len(body)))
    # A chunked upload is forwarded as sent: its chunks, extensions and trailer, still chunked.
    assert (m2, b2, h2.get("Transfer-Encoding")) == ("PUT", chunked, "chunked") and "Content-Length" not in h2
    # HEAD keeps the object's length (not the empty body's); GET's body is whole.
    assert head_body == b"" and head_headers["Content-Length"] == str(len(_Recorder.ANSWER))
    assert got == _Recorder.ANSWER and get_headers["Content-Length"] == str(len(_Recorder.ANSWER))
    assert status == status_get == 200 and proxy.failed == 0


def test_random_faults_follow_their_seed(upstream):
    def pattern(seed: int) -> list[int]:
        with FaultProxy(upstream.url) as proxy:
            proxy.fail_randomly(0.5, seed, modes=("503",))
            return [_request(proxy, "GET")[0] for _ in range(24)]

    first = pattern(3)
    assert first == pattern(3)
    assert 503 in first and 200 in first
    assert first != pattern(4)


def test_lost_answers_reach_the_upstream(upstream):
    with FaultProxy(upstream.url) as proxy:
        proxy.fail_next(1, "lost")
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            _request(proxy, "PUT", b"acted", {"Content-Length": "5"})
        proxy.fail_next(1, "drop")
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            _request(proxy, "PUT", b"never", {"Content-Length": "5"})
    # The lost one was carried out upstream; the dropped one never arrived.
    assert [b for _, _, b in upstream.seen] == [b"acted"]
    assert proxy.failed_by_mode["lost"] == proxy.failed_by_mode["drop"] == 1
