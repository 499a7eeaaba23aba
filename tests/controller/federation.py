"""Federation's other ends on 127.0.0.1, for the controller reaching the other cloud's group.

:class:`GoogleSide` plays what Google runs:

- the GCE metadata server's identity endpoint
  (``/computeMetadata/v1/instance/service-accounts/default/identity?audience=AUD&format=full``,
  ``Metadata-Flavor: Google`` required): an ID token for that audience, with the claims Google
  puts in a service account's token (``aud`` = the audience, ``azp`` and ``sub`` = the account's
  numeric unique id); ``id_tokens`` keeps (audience, format, token) of each answer;
- Google's STS token exchange (``POST /v1/token``) for a Workload Identity Pool's AWS provider:
  the subject token is google-auth's serialized, signed ``GetCallerIdentity`` request. As Google
  does, it checks the request is STS's GetCallerIdentity for the provider (the
  ``x-goog-cloud-target-resource`` header names the audience), sends it to AWS (here moto_server,
  which answers with the caller's ARN) and applies the provider's attribute condition (the
  assumed role's name, in the provider's AWS account). ``exchanges`` keeps what it saw;
- the IAM Credentials API's ``generateAccessToken`` for the one service account the pool's
  principal (that role) may impersonate; the access tokens it gives are ``access_tokens``, which
  the fake Compute API (``tests/fixtures/gce_groups.py``'s ``authorize``) then requires.

- OAuth's token endpoint (``POST /token``) for an operator's own credentials (the ``authorized_user``
  file ``gcloud auth application-default login`` writes; google-auth refreshes it at
  ``google.oauth2.credentials._GOOGLE_OAUTH2_TOKEN_ENDPOINT``, which a test points here): a refresh
  token in ``refresh_tokens`` gets an access token, kept in ``operator_tokens``.

``fail_next(n)`` answers the next ``n`` STS or IAM Credentials requests 503 (Google's JSON
error shape). A refusal is answered as Google's: OAuth's ``invalid_grant`` from STS, 403
``PERMISSION_DENIED`` from IAM Credentials.

:class:`WebIdentityGate` stands in front of moto_server (a :class:`~devtools.fault_proxy.FaultProxy`
gate): moto's ``AssumeRoleWithWebIdentity`` checks neither the token's signature nor the role's
trust conditions, so the gate checks what AWS checks for ``accounts.google.com`` against the
trust the test gives: ``accounts.google.com:oaud`` (the token's ``aud``), ``:aud`` (its ``azp``)
and ``:sub`` (its ``sub``), and keeps each (role, token) presented. A refused one gets STS's
``AccessDenied``; an accepted one goes on to moto, and ``on_assumed`` hears the access key moto
gave (to guard it with the role's policy in the IAM layer). A moto_server enforcing IAM answers an
unsigned request (as ``AssumeRoleWithWebIdentity`` is) with HTTP 500: given ``admin`` keys, the
gate has moto's STS issue the role's session with ``AssumeRole`` signed by them instead (moto checks
that call against the role's trust: the test's trust names the admin user beside Google), and answers
in ``AssumeRoleWithWebIdentity``'s shape (the same credentials moto then enforces as the role's).
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

STS_XMLNS = "https://sts.amazonaws.com/doc/2011-06-15/"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(token: str) -> dict:
    """The payload of a JWT (unverified: the stand-ins sign nothing)."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


@dataclass
class Pool:
    """A Workload Identity Pool's AWS provider and what its principal may impersonate."""

    audience: str  # //iam.googleapis.com/projects/N/locations/global/workloadIdentityPools/P/providers/V
    account: str  # the provider's aws.accountId
    role: str  # the attribute condition: attribute.aws_role == this role's name
    service_account: str  # the one account roles/iam.workloadIdentityUser is granted on


class GoogleSide:
    """Google's metadata identity endpoint, STS and IAM Credentials (module docstring)."""

    def __init__(self, *, moto: str, pool: Pool | None = None, unique_id: str = "104812345678901234567") -> None:
        self.moto = urlsplit(moto)
        self.pool = pool
        self.unique_id = unique_id
        self.id_tokens: list[tuple[str, str, str]] = []
        self.exchanges: list[dict] = []
        self.impersonations: list[tuple[str, bool]] = []
        self.access_tokens: dict[str, str] = {}  # token -> service account
        self._federated: dict[str, str] = {}  # federated token -> role ARN
        self.refresh_tokens: set[str] = set()
        self.operator_tokens: list[str] = []
        self._fail = 0
        self._lock = threading.Lock()
        side = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, kind, data = side.handle(self.command, self.path, self.headers, body)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        self.url = f"http://{self.host}"
        self.token_url = f"{self.url}/v1/token"
        self.iam_credentials = f"{self.url}/v1"
        threading.Thread(target=self._server.serve_forever, name="google-side", daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail_next(self, n: int) -> None:
        with self._lock:
            self._fail += n

    def authorized(self, service_account: str) -> Callable[[str, str], bool]:
        """For the fake Compute API: a request is authorized by an access token of ``service_account``."""
        return lambda _group, header: self.access_tokens.get(header.removeprefix("Bearer ")) == service_account

    # -- the three endpoints -----------------------------------------------------------

    def handle(self, method: str, target: str, headers, body: bytes) -> tuple[int, str, bytes]:
        parts = urlsplit(target)
        if parts.path == "/computeMetadata/v1/instance/service-accounts/default/identity" and method == "GET":
            if headers.get("Metadata-Flavor") != "Google":
                return 403, "text/plain", b"Missing Metadata-Flavor:Google header."
            q = {k: v[0] for k, v in parse_qs(parts.query).items()}
            token = self.id_token(q.get("audience", ""))
            self.id_tokens.append((q.get("audience", ""), q.get("format", ""), token))
            return 200, "text/plain", token.encode()
        if method == "POST" and parts.path == "/token":
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            if form.get("grant_type") != "refresh_token" or form.get("refresh_token") not in self.refresh_tokens:
                return _json(400, {"error": "invalid_grant", "error_description": "Bad Request"})
            token = f"ya29.operator-{uuid.uuid4().hex}"
            self.operator_tokens.append(token)
            return _json(200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer",
                               "scope": "https://www.googleapis.com/auth/cloud-platform"})
        if method == "POST" and (parts.path == "/v1/token" or parts.path.endswith(":generateAccessToken")):
            with self._lock:
                failing = self._fail > 0
                self._fail -= failing
            if failing:
                return _json(503, {"error": {"code": 503, "message": "The service is currently unavailable.",
                                             "status": "UNAVAILABLE"}})
            if parts.path == "/v1/token":
                return self._exchange({k: v[0] for k, v in parse_qs(body.decode()).items()})
            return self._impersonate(unquote(parts.path), headers.get("Authorization", ""), json.loads(body or b"{}"))
        return _json(404, {"error": {"code": 404, "message": f"no {method} {parts.path} here", "status": "NOT_FOUND"}})

    def id_token(self, audience: str) -> str:
        now = int(time.time())
        payload = {"iss": "https://accounts.google.com", "aud": audience, "azp": self.unique_id, "sub": self.unique_id,
                   "email": "ts-controller@home-proj.iam.gserviceaccount.com", "email_verified": True,
                   "iat": now, "exp": now + 3600}
        return ".".join([_b64(b'{"alg":"RS256","typ":"JWT"}'), _b64(json.dumps(payload).encode()), _b64(b"sig")])

    def _exchange(self, form: dict[str, str]) -> tuple[int, str, bytes]:
        seen: dict = {"audience": form.get("audience"), "subject_token_type": form.get("subject_token_type")}
        self.exchanges.append(seen)
        pool = self.pool
        if pool is None or form.get("audience") != pool.audience:
            return _refused("The audience in the request is not a provider of this pool.")
        if (form.get("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange"
                or form.get("subject_token_type") != "urn:ietf:params:aws:token-type:aws4_request"):
            return _json(400, {"error": "invalid_request", "error_description": "unsupported token types"})
        signed = json.loads(unquote(form.get("subject_token", "")))
        heads = {h["key"].lower(): h["value"] for h in signed.get("headers", [])}
        url = urlsplit(signed.get("url", ""))
        host = re.fullmatch(r"sts\.([a-z0-9-]+)\.amazonaws\.com", url.hostname or "")
        scope = re.search(r"Credential=([^/]+)/\d{8}/([a-z0-9-]+)/sts/aws4_request", heads.get("authorization", ""))
        seen.update(url=signed.get("url"), method=signed.get("method"), target=heads.get("x-goog-cloud-target-resource"),
                    region=scope and scope.group(2), host_region=host and host.group(1), key=scope and scope.group(1))
        if not (host and scope and host.group(1) == scope.group(2) and parse_qs(url.query).get("Action") == [
                "GetCallerIdentity"] and heads.get("x-goog-cloud-target-resource") == pool.audience):
            return _refused("The subject token is not a signed GetCallerIdentity request for this provider.")
        status, answer = self._ask_aws(signed["method"], url, heads)
        arn = re.search(r"<Arn>([^<]+)</Arn>", answer)
        seen["arn"] = arn and arn.group(1)
        if status != 200 or not arn:
            return _refused(f"AWS did not accept the signed request: HTTP {status}")
        role = re.fullmatch(r"arn:aws:sts::(\d{12}):assumed-role/([^/]+)/.+", arn.group(1))
        if not role or role.group(1) != pool.account or role.group(2) != pool.role:
            return _refused("The given credential is rejected by the attribute condition.")
        token = f"fed.{uuid.uuid4().hex}"
        self._federated[token] = arn.group(1)
        return _json(200, {"access_token": token, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                           "token_type": "Bearer", "expires_in": 3600})

    def _ask_aws(self, method: str, url, heads: dict[str, str]) -> tuple[int, str]:
        """The signed request, sent as signed (its Host header included) to moto_server."""
        conn = http.client.HTTPConnection(self.moto.hostname, self.moto.port, timeout=30)
        try:
            conn.request(method, f"{url.path or '/'}?{url.query}", body=b"", headers=heads)
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()

    def _impersonate(self, path: str, authorization: str, body: dict) -> tuple[int, str, bytes]:
        account = re.fullmatch(r"/v1/projects/-/serviceAccounts/([^:]+):generateAccessToken", path)
        principal = self._federated.get(authorization.removeprefix("Bearer "))
        allowed = bool(account and principal and self.pool and account.group(1) == self.pool.service_account)
        self.impersonations.append((account.group(1) if account else path, allowed))
        if not allowed:
            return _json(403, {"error": {"code": 403, "status": "PERMISSION_DENIED", "message":
                                         "Permission 'iam.serviceAccounts.getAccessToken' denied on resource "
                                         "(or it may not exist)."}})
        token = f"ya29.{uuid.uuid4().hex}"
        self.access_tokens[token] = account.group(1)  # type: ignore[union-attr]
        expires = (datetime.now(tz=UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return _json(200, {"accessToken": token, "expireTime": expires})


def _json(status: int, doc: dict) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(doc).encode()


def _refused(why: str) -> tuple[int, str, bytes]:
    return _json(400, {"error": "invalid_grant", "error_description": why})


class WebIdentityGate:
    """AWS's checks of a Google token against a role's trust, in front of moto (module docstring)."""

    def __init__(self, upstream: str, *, audience: str, unique_id: str, inner=None,
                 on_assumed: Callable[[str], None] | None = None, admin: tuple[str, str] | None = None) -> None:
        self.upstream, self.admin = upstream, admin
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.audience, self.unique_id = audience, unique_id
        self.inner = inner
        self.on_assumed = on_assumed
        #: (role ARN, token, accepted) of every AssumeRoleWithWebIdentity.
        self.presented: list[tuple[str, str, bool]] = []

    def applies(self, method: str, path: str, headers) -> bool:
        return method == "POST" and ("Authorization" not in headers or bool(
            self.inner and self.inner.applies(method, path, headers)))

    def refuse(self, method: str, path: str, headers, body: bytes):
        form = {k: v[0] for k, v in parse_qs(body.decode(errors="replace")).items()}
        if form.get("Action") != "AssumeRoleWithWebIdentity":
            if self.inner is not None and self.inner.applies(method, path, headers):
                return self.inner.refuse(method, path, headers, body)
            return None
        token = form.get("WebIdentityToken", "")
        try:
            got = claims(token)
        except ValueError:
            got = {}
        ok = (got.get("iss") == "https://accounts.google.com" and got.get("aud") == self.audience
              and got.get("azp") == self.unique_id and got.get("sub") == self.unique_id)
        self.presented.append((form.get("RoleArn", ""), token, ok))
        if not ok:
            return 403, "text/xml", (
                f'<ErrorResponse xmlns="{STS_XMLNS}"><Error><Type>Sender</Type><Code>AccessDenied</Code>'
                "<Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error>"
                f"<RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>").encode()
        if self.admin is not None:
            status, payload = self._as_admin(form, got)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                conn.request(method, path, body=body, headers={k: v for k, v in headers.items()
                                                                 if k.lower() not in ("connection", "content-length")})
                resp = conn.getresponse()
                status, payload = resp.status, resp.read()
            finally:
                conn.close()
        key = re.search(rb"<AccessKeyId>([^<]+)</AccessKeyId>", payload)
        if status == 200 and key and self.on_assumed is not None:
            self.on_assumed(key.group(1).decode())
        return status, "text/xml", payload

    def _as_admin(self, form: dict[str, str], got: dict) -> tuple[int, bytes]:
        from xml.sax.saxutils import escape

        import boto3

        sts = boto3.session.Session().client("sts", endpoint_url=self.upstream, region_name="us-east-1",
                                             aws_access_key_id=self.admin[0],  # type: ignore[index]
                                             aws_secret_access_key=self.admin[1])  # type: ignore[index]
        out = sts.assume_role(RoleArn=form.get("RoleArn", ""), RoleSessionName=form.get("RoleSessionName", "web"))
        c, user = out["Credentials"], out["AssumedRoleUser"]
        return 200, (
            f'<AssumeRoleWithWebIdentityResponse xmlns="{STS_XMLNS}"><AssumeRoleWithWebIdentityResult>'
            f"<SubjectFromWebIdentityToken>{escape(got['sub'])}</SubjectFromWebIdentityToken>"
            f"<Audience>{escape(got['azp'])}</Audience><Provider>accounts.google.com</Provider>"
            f"<AssumedRoleUser><Arn>{escape(user['Arn'])}</Arn><AssumedRoleId>{escape(user['AssumedRoleId'])}"
            "</AssumedRoleId></AssumedRoleUser>"
            f"<Credentials><AccessKeyId>{c['AccessKeyId']}</AccessKeyId><SecretAccessKey>{escape(c['SecretAccessKey'])}"
            f"</SecretAccessKey><SessionToken>{escape(c['SessionToken'])}</SessionToken>"
            f"<Expiration>{c['Expiration'].strftime('%Y-%m-%dT%H:%M:%SZ')}</Expiration></Credentials>"
            f"</AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId>"
            "</ResponseMetadata></AssumeRoleWithWebIdentityResponse>").encode()
