"""A tag's digest as `pulumi up` asks the registry for it (components/registry.py), against a real
OCI registry (Debian's docker-registry, one per test worker) and, for Docker Hub's anonymous token
protocol and outages, a small HTTP server that answers as the protocol documents."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from email.message import Message

import pytest

from components import registry
from components.settings import ConfigError, load_settings
from tests.fixtures.oci_images import oci_layout, push, raw_digest


def _pushed(tmp_path, oci_registry: str, **kw) -> tuple[str, str]:
    """A fresh repository on the registry with one image tagged v1: (repository, its top digest)."""
    repo = f"{oci_registry}/t/{uuid.uuid4().hex[:12]}"
    digest = oci_layout(tmp_path / "layout", "v1", **kw)
    push(tmp_path / "layout", "v1", f"{repo}:v1")
    return repo, digest


def test_a_tag_resolves_to_the_digest_of_the_manifest_the_registry_serves(tmp_path, oci_registry):
    repo, digest = _pushed(tmp_path, oci_registry)
    assert registry.manifest_digest(repo, "v1") == digest == raw_digest(f"{repo}:v1")


def test_a_multi_platform_tag_resolves_to_its_index_as_docker_pull_does(tmp_path, oci_registry):
    repo, digest = _pushed(tmp_path, oci_registry, platforms=("amd64", "arm64"))
    got = registry.manifest_digest(repo, "v1")
    assert got == digest == raw_digest(f"{repo}:v1")
    index = json.loads((tmp_path / "layout/blobs/sha256" / digest.removeprefix("sha256:")).read_text())
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json" and len(index["manifests"]) == 2


def test_an_unknown_tag_is_the_registrys_verdict_at_once(tmp_path, oci_registry):
    repo, _ = _pushed(tmp_path, oci_registry)
    with pytest.raises(registry.RegistryError, match=r"has no manifest t/\w+:v2$"):
        registry.manifest_digest(repo, "v2", pause_s=30)  # a verdict is not retried: no pause is waited


def _settings(**image) -> object:
    return load_settings({"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True}, "image": image}, stack="t")


def test_pulumi_up_pins_the_stack_to_the_tags_digest_and_a_given_digest_wins(tmp_path, oci_registry):
    repo, digest = _pushed(tmp_path, oci_registry)
    pinned = registry.pinned(_settings(repository=repo, tag="v1"))
    assert pinned.image.reference == f"{repo}@{digest}"
    given = "sha256:" + "1" * 64
    token = registry.DIGEST_SOURCE.set(lambda r, t: pytest.fail("a given digest asks no registry"))
    try:
        assert registry.pinned(_settings(repository=repo, tag="v1", digest=given)).image.reference == f"{repo}@{given}"
    finally:
        registry.DIGEST_SOURCE.reset(token)


@pytest.mark.parametrize(("name", "host", "path"), [
    ("tensorflow/tensorflow", "registry-1.docker.io", "tensorflow/tensorflow"),
    ("ubuntu", "registry-1.docker.io", "library/ubuntu"),
    ("docker.io/library/ubuntu", "registry-1.docker.io", "library/ubuntu"),
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer", "123456789012.dkr.ecr.us-east-1.amazonaws.com", "trainer"),
    ("localhost:5000/a/b", "localhost:5000", "a/b"),
])
def test_docker_pulls_naming_rules_pick_the_registry(name, host, path):
    loc = registry.where(name)
    assert (loc.host, loc.name) == (host, path)
    scheme = "http" if host.startswith("localhost") else "https"
    assert loc.manifest_url("t") == f"{scheme}://{host}/v2/{path}/manifests/t"


class _Hub(http.server.BaseHTTPRequestHandler):
    """Docker Hub as its token protocol documents it: a manifest needs a Bearer token, which the realm
    gives anonymously for a pull scope; `fail` answers 503 that many times first."""

    digest = "sha256:" + "e" * 64
    seen: list[tuple[str, str, str]] = []
    fail = 0

    def log_message(self, *args) -> None:
        pass

    def _answer(self) -> None:
        cls = type(self)
        cls.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        if cls.fail:
            cls.fail -= 1
            self.send_response(503)
            self.end_headers()
            return
        port = self.server.server_address[1]
        if self.path.startswith("/token?"):
            body = json.dumps({"token": "anon-token"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.headers.get("Authorization") != "Bearer anon-token":
            self.send_response(401)
            # Docker Hub's own spelling: header names in lower case.
            self.send_header("www-authenticate", f'Bearer realm="http://127.0.0.1:{port}/token",'
                             'service="registry.docker.io",scope="repository:tensorflow/tensorflow:pull"')
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_response(200)
            self.send_header("docker-content-digest", cls.digest)
            self.send_header("Content-Length", "0")
            self.end_headers()

    do_HEAD = do_GET = _answer  # noqa: N815 (http.server's names)


@pytest.fixture
def hub() -> Iterator[str]:
    _Hub.seen, _Hub.fail = [], 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_401_is_answered_with_an_anonymous_pull_token_from_the_challenges_realm(hub):
    assert registry.manifest_digest(f"{hub}/tensorflow/tensorflow", "2.21.0-gpu") == _Hub.digest
    assert _Hub.seen == [
        ("HEAD", "/v2/tensorflow/tensorflow/manifests/2.21.0-gpu", ""),
        ("GET", "/token?scope=repository%3Atensorflow%2Ftensorflow%3Apull&service=registry.docker.io", ""),
        ("HEAD", "/v2/tensorflow/tensorflow/manifests/2.21.0-gpu", "Bearer anon-token"),
    ]


def test_an_outage_is_retried_and_one_that_lasts_stops_pulumi_up_with_one_line_naming_the_keys(hub):
    _Hub.fail = 2
    assert registry.manifest_digest(f"{hub}/tensorflow/tensorflow", "x", pause_s=0) == _Hub.digest
    _Hub.fail = 100
    token = registry.DIGEST_SOURCE.set(lambda r, t: registry.manifest_digest(r, t, pause_s=0))
    try:
        with pytest.raises(ConfigError) as e:
            registry.pinned(_settings(repository=f"{hub}/tensorflow/tensorflow", tag="x"))
    finally:
        registry.DIGEST_SOURCE.reset(token)
    assert str(e.value) == (f"trainstack:image.tag: cannot resolve {hub}/tensorflow/tensorflow:x to a digest: {hub} "
                            "answered HTTP 503 (after 3 tries); pin it with image.digest (sha256:...)")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("realm", ["file:///etc/passwd", "http://auth.example.com/token", "ftp://x/token"])
def test_a_token_realm_off_https_is_refused_before_it_is_asked(realm, monkeypatch):
    asked: list[str] = []

    def answer(method, url, token, timeout):
        asked.append(url)
        headers = Message()
        headers["WWW-Authenticate"] = f'Bearer realm="{realm}",service="s"'
        return 401, headers, b""

    monkeypatch.setattr(registry, "_request", answer)
    with pytest.raises(registry.RegistryError, match="names a token realm that is not https"):
        registry.manifest_digest("example.com/a/b", "t")
    assert asked == ["https://example.com/v2/a/b/manifests/t"]
