"""A public image's tag resolved to its digest at `pulumi up`, with the registry HTTP API v2.

Every machine runs its image by digest (docs/images.md): a digest the user gives
(`image.digest`) wins; otherwise `pinned` asks the image's registry which
manifest the tag names now, once per `pulumi up`, and every machine of the stack pulls that
digest. A tag that moves later changes nothing on a running stack; the next `pulumi up`
sees the new digest and replaces the launch templates.

The lookup is the protocol's own (distribution's `docs/spec/api.md`, `docs/spec/auth/token.md`):

- `HEAD /v2/<name>/manifests/<tag>` with an `Accept` of every manifest and index type a
  `docker pull` accepts, so a multi-platform tag resolves to its index, as `docker pull` does;
  the answer's `Docker-Content-Digest` is the digest. A registry that leaves the header out
  is asked with `GET` and the digest is the sha256 of the bytes it sends.
- A `401` with `WWW-Authenticate: Bearer realm=…,service=…` (Docker Hub, ghcr.io, quay.io)
  is answered with an anonymous pull token from the realm (`?service=…&scope=repository:<name>:pull`),
  and the request is made again with it. No credential is ever sent: a private repository
  is pinned with `image.digest` (or built by the stack: `image.build`).
- `https://` always, but for a registry on the loopback address (the tests'), which Docker
  itself also reaches over plain HTTP.

Short outages are retried (3 tries, 1 s then 2 s apart); a registry's verdict (404 unknown
tag, 401 that no anonymous token lifts) fails at once. Either way `pulumi up` stops with one
line naming `image.tag` and `image.digest`, before any resource is made.

`pinned(settings)` is called once, by `components.multicloud.training_stack`.

`ops synth` runs offline: `DIGEST_SOURCE` is a seam the mock runs set to `synth_digest`, a
stand-in digest that depends only on the reference, recorded in `SYNTH_LOOKUPS` so the plan
says where `pulumi up` would look.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message

from components.settings import ConfigError

# Docker Hub's names: a repository without a registry host is Docker Hub's, and a one-part
# name is an official image under `library/`.
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
# What `docker pull` accepts, indexes first: the digest of a multi-platform tag is its index's.
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
TIMEOUT_S = 10.0
TRIES = 3
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


class RegistryError(Exception):
    """The registry gave no digest for the tag: the message says why (one line)."""


class _Passing(RegistryError):
    """An outage worth another try (a connection refused or reset, a 429 or 5xx answer)."""


@dataclass(frozen=True)
class Where:
    """A repository as the registry API sees it."""

    host: str
    """The registry's API host (`registry-1.docker.io` for Docker Hub), with its port if any."""
    name: str
    """The repository's name there (`library/ubuntu` for Docker Hub's `ubuntu`)."""

    @property
    def base(self) -> str:
        scheme = "http" if self.host.rsplit(":", 1)[0] in LOOPBACK else "https"
        return f"{scheme}://{self.host}/v2/{self.name}"

    def manifest_url(self, tag: str) -> str:
        """The URL `pulumi up` asks for the tag's manifest."""
        return f"{self.base}/manifests/{tag}"


def where(repository: str) -> Where:
    """The registry host and repository name of an image repository (`docker pull`'s rules:
    the first part is a host when it has a '.' or ':' or is `localhost`)."""
    first, _, rest = repository.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        host, name = first, rest
    else:
        host, name = DOCKER_HUB, repository
    if host == DOCKER_HUB:
        host = DOCKER_HUB_API
        if "/" not in name:
            name = f"library/{name}"
    return Where(host, name)


def manifest_digest(repository: str, tag: str, *, timeout: float = TIMEOUT_S, tries: int = TRIES,
                    pause_s: float = 1.0) -> str:
    """The digest (`sha256:<hex>`) of the manifest or index `repository:tag` names now.

    Raises RegistryError with the reason when the registry does not give one.
    """
    loc = where(repository)
    for attempt in range(1, tries + 1):
        try:
            return _lookup(loc, tag, timeout)
        except _Passing as e:
            if attempt == tries:
                raise RegistryError(f"{e} (after {tries} tries)") from e
            time.sleep(pause_s * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _lookup(loc: Where, tag: str, timeout: float) -> str:
    url = loc.manifest_url(tag)
    token = None
    for method in ("HEAD", "GET"):
        status, headers, body = _request(method, url, token, timeout)
        if status == 401 and token is None:
            token = _anonymous_token(headers.get("WWW-Authenticate", ""), loc, timeout)
            status, headers, body = _request(method, url, token, timeout)
        if status == 404:
            raise RegistryError(f"{loc.host} has no manifest {loc.name}:{tag}")
        if status in (401, 403):
            raise RegistryError(f"{loc.host} refuses an anonymous pull of {loc.name} (HTTP {status})")
        if status != 200:
            raise RegistryError(f"{loc.host} answered HTTP {status} for {loc.name}:{tag}")
        said = headers.get("Docker-Content-Digest", "")
        if method == "GET":
            got = "sha256:" + hashlib.sha256(body).hexdigest()
            if said and said != got:
                raise RegistryError(f"{loc.host} sent a manifest for {loc.name}:{tag} whose sha256 {got} is not its "
                                    f"Docker-Content-Digest {said}")
            return got
        if DIGEST_RE.fullmatch(said):
            return said
    raise AssertionError("unreachable")


def _request(method: str, url: str, token: str | None, timeout: float) -> tuple[int, Message, bytes]:
    """(status, headers, body): the headers as sent, read without regard to case (Docker Hub sends
    `docker-content-digest` and `www-authenticate` in lower case)."""
    # Only http(s) URLs reach here: the manifest's (Where.base) and a realm _anonymous_token checked.
    req = urllib.request.Request(url, method=method, headers={"Accept": ", ".join(MANIFEST_TYPES)})  # noqa: S310
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (http(s) URLs built above)
            return resp.status, resp.headers, resp.read() if method == "GET" else b""
    except urllib.error.HTTPError as e:
        if e.code == 429 or e.code >= 500:
            raise _Passing(f"{urllib.parse.urlsplit(url).netloc} answered HTTP {e.code}") from e
        return e.code, e.headers, b""
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise _Passing(f"cannot reach {urllib.parse.urlsplit(url).netloc}: {reason}") from e


def _anonymous_token(challenge: str, loc: Where, timeout: float) -> str:
    """A pull token from the challenge's realm, asked without credentials (the token protocol)."""
    scheme, _, params = challenge.partition(" ")
    fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
    if scheme.lower() != "bearer" or not fields.get("realm"):
        raise RegistryError(f"{loc.host} asks for credentials ({challenge or 'no challenge'}), and none are sent")
    realm = urllib.parse.urlsplit(fields["realm"])
    if not (realm.scheme == "https" or (realm.scheme == "http" and realm.hostname in ("127.0.0.1", "localhost", "::1"))):
        # A token travels no plain-HTTP hop but the tests' loopback, and never to a file: or other scheme.
        raise RegistryError(f"{loc.host} names a token realm that is not https: {fields['realm']}")
    query = {"scope": f"repository:{loc.name}:pull"}
    if fields.get("service"):
        query["service"] = fields["service"]
    url = f"{fields['realm']}?{urllib.parse.urlencode(query)}"
    status, _, body = _request("GET", url, None, timeout)
    if status != 200:
        raise RegistryError(f"{urllib.parse.urlsplit(url).netloc} gave no anonymous token for {loc.name} (HTTP {status})")
    try:
        answer = json.loads(body)
        token = answer.get("token") or answer.get("access_token")
    except (ValueError, AttributeError):
        token = None
    if not isinstance(token, str) or not token:
        raise RegistryError(f"{urllib.parse.urlsplit(url).netloc} answered without a token for {loc.name}")
    return token


# ---- the seam: where a tag's digest comes from


def stand_in(repository: str, tag: str) -> str:
    """The stand-in digest of `repository:tag` under the mocks: it depends only on the reference."""
    return "sha256:" + hashlib.sha256(f"synth stand-in for {repository}:{tag}".encode()).hexdigest()


def synth_digest(repository: str, tag: str) -> str:
    """`ops synth`'s lookup: no registry is asked; the stand-in, recorded with where `pulumi up` would ask."""
    SYNTH_LOOKUPS.get().append((repository, tag, where(repository).manifest_url(tag)))
    return stand_in(repository, tag)


DIGEST_SOURCE: contextvars.ContextVar[Callable[[str, str], str]] = contextvars.ContextVar(
    "DIGEST_SOURCE", default=manifest_digest)
"""What resolves a tag: the registry (`manifest_digest`), or `synth_digest` under the mocks."""
SYNTH_LOOKUPS: contextvars.ContextVar[list[tuple[str, str, str]]] = contextvars.ContextVar("SYNTH_LOOKUPS")
"""(repository, tag, the URL `pulumi up` would ask) of each stand-in digest; set with DIGEST_SOURCE."""


def use_synth_digests() -> list[tuple[str, str, str]]:
    """Make this context's lookups `synth_digest`'s; returns the list they are recorded in."""
    lookups: list[tuple[str, str, str]] = []
    SYNTH_LOOKUPS.set(lookups)
    DIGEST_SOURCE.set(synth_digest)
    return lookups


def pinned(settings):
    """`settings` with `image.digest` set: the one given, else the tag's digest now (what every machine
    pulls and runs, and what a built image's Dockerfile builds FROM).

    A registry that gives none raises ConfigError naming `image.tag` and `image.digest` (one line).
    """
    image = settings.image
    if image.digest:
        return settings
    try:
        digest = DIGEST_SOURCE.get()(image.repository, image.tag)
    except RegistryError as e:
        raise ConfigError("image.tag", f"cannot resolve {image.repository}:{image.tag} to a digest: {e}; "
                          "pin it with image.digest (sha256:...)") from e
    if not DIGEST_RE.fullmatch(digest):
        raise ConfigError("image.tag", f"{image.repository}:{image.tag} resolved to {digest!r}, not a sha256 "
                          "digest; pin it with image.digest")
    return settings.model_copy(update={"image": image.model_copy(update={"digest": digest})})
