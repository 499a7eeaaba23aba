"""The few GCP reads preflight needs: the `GcpApi` protocol (a fake in tests) and its REST client.

`RestGcpApi` reads the public REST endpoints (Compute Engine, Service Usage, Cloud Storage, Cloud Resource
Manager's testIamPermissions) with Application Default Credentials (google-auth); an answer that says its API is off
becomes `ApiDisabled`, which the checks turn into one line naming the API to turn on.

Another service's quotas (Vertex AI's custom-training GPUs: `service_quota_limits`) are read from Service
Usage's consumerQuotaMetrics (v1beta1), not the Cloud Quotas API: preflight already reads Service Usage (the
enabled APIs), and `pulumi up` needs it on before anything else, while Cloud Quotas is one more API a new
project has off. The caller needs serviceusage.quotas.get (roles/serviceusage.serviceUsageViewer).
"""

from __future__ import annotations

import re
from typing import Any, Protocol


class GcpApi(Protocol):
    """The few GCP reads preflight needs (a fake in tests, REST with google-auth for real)."""

    def region_quotas(self, project: str, region: str) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of the region's Compute Engine quotas."""

    def project_quotas(self, project: str) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of the project's global Compute Engine quotas."""

    def enabled_services(self, project: str) -> set[str]:
        """Names of the services (APIs) enabled in the project."""

    def region_zones(self, project: str, region: str) -> list[str]:
        """The region's zone names."""

    def offered(self, project: str, zone: str, kind: str, name: str) -> bool:
        """Whether the zone offers the machine type (kind "machineTypes") or GPU ("acceleratorTypes")."""

    def bucket_permissions(self, bucket: str, permissions: list[str]) -> set[str] | None:
        """Which of `permissions` the caller has on a GCS bucket; None when there is no such bucket."""

    def publicly_readable(self, bucket: str, prefix: str) -> bool:
        """Whether anyone, without credentials, may list the bucket's objects under `prefix`."""

    def network(self, project: str, name: str) -> dict | None:
        """The project's VPC network of that name (Compute Engine's resource); None when there is none."""

    def routes(self, project: str) -> list[dict]:
        """Every route of the project (Compute Engine's resources)."""

    def project_permissions(self, project: str, permissions: list[str]) -> set[str]:
        """Which of `permissions` the caller has on the project (its roles there and those it inherits)."""

    def service_quota_limits(self, project: str, service: str, metric: str) -> dict[str, float] | None:
        """region -> the project's effective limit of a per-region quota `metric` of `service` ("" for the
        default of every other region; -1 for no limit); None when the service has no such metric."""


COMPUTE_API = "compute.googleapis.com"


class ApiDisabled(RuntimeError):
    """A GCP read refused because its API is off in the project (HTTP 403, reason SERVICE_DISABLED)."""

    def __init__(self, service: str, detail: str) -> None:
        super().__init__(f"{service} is off: {detail}")
        self.service = service


def api_disabled(status: int, doc: Any) -> ApiDisabled | None:
    """The ApiDisabled a GCP error answer stands for, or None when it is another error.

    Google's APIs answer a call to an API that is off with 403 and an ErrorInfo detail whose
    reason is SERVICE_DISABLED and whose metadata names the service (older ones only say
    accessNotConfigured, with the service's name in the message).
    """
    error = doc.get("error") if isinstance(doc, dict) else None
    if status != 403 or not isinstance(error, dict):
        return None
    message = str(error.get("message", ""))
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and detail.get("reason") == "SERVICE_DISABLED":
            service = (detail.get("metadata") or {}).get("service") or ""
            return ApiDisabled(service or "an API", message)
    if any(isinstance(e, dict) and e.get("reason") == "accessNotConfigured" for e in error.get("errors") or []):
        named = re.search(r"[a-z0-9-]+\.googleapis\.com", message)
        return ApiDisabled(named.group(0) if named else "an API", message)
    return None


class RestGcpApi:
    """GcpApi over the public REST endpoints, with Application Default Credentials (google-auth)."""

    def __init__(self, session: Any = None, anonymous: Any = None) -> None:
        if session is None:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
            session = AuthorizedSession(credentials)
        if anonymous is None:
            import requests

            anonymous = requests.Session()
        self._session, self._anonymous = session, anonymous

    def _get(self, url: str, params: dict | None = None, *, absent_ok: bool = False) -> dict | None:
        return self._answer("GET", url, self._session.get(url, params=params, timeout=30), absent_ok=absent_ok)

    def _post(self, url: str, body: dict) -> dict:
        return self._answer("POST", url, self._session.post(url, json=body, timeout=30))  # type: ignore[return-value]

    @staticmethod
    def _answer(method: str, url: str, resp: Any, *, absent_ok: bool = False) -> dict | None:
        if absent_ok and resp.status_code == 404:
            return None
        if resp.status_code != 200:
            try:
                doc = resp.json()
            except ValueError:
                doc = None
            disabled = api_disabled(resp.status_code, doc)
            if disabled:
                raise disabled
            raise RuntimeError(f"{method} {url}: HTTP {resp.status_code} {resp.text[:200]}")
        return resp.json()

    def region_quotas(self, project: str, region: str) -> dict[str, tuple[float, float]]:
        """See GcpApi."""
        doc = self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}/regions/{region}")
        return {q["metric"]: (float(q["limit"]), float(q.get("usage", 0))) for q in doc.get("quotas", [])}

    def project_quotas(self, project: str) -> dict[str, tuple[float, float]]:
        """See GcpApi."""
        doc = self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}")
        return {q["metric"]: (float(q["limit"]), float(q.get("usage", 0))) for q in doc.get("quotas", [])}

    def region_zones(self, project: str, region: str) -> list[str]:
        """See GcpApi."""
        doc = self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}/regions/{region}")
        return sorted(url.rsplit("/", 1)[-1] for url in doc.get("zones", []))

    def offered(self, project: str, zone: str, kind: str, name: str) -> bool:
        """See GcpApi."""
        url = f"https://compute.googleapis.com/compute/v1/projects/{project}/zones/{zone}/{kind}/{name}"
        return self._get(url, absent_ok=True) is not None

    def bucket_permissions(self, bucket: str, permissions: list[str]) -> set[str] | None:
        """See GcpApi (GCS testIamPermissions: the subset of `permissions` the caller has)."""
        doc = self._get(f"https://storage.googleapis.com/storage/v1/b/{bucket}/iam/testPermissions",
                        {"permissions": list(permissions)}, absent_ok=True)
        return None if doc is None else set(doc.get("permissions", []))

    def project_permissions(self, project: str, permissions: list[str]) -> set[str]:
        """See GcpApi (Cloud Resource Manager's projects.testIamPermissions, which asks no permission of its own:
        the subset of `permissions` the caller has)."""
        doc = self._post(f"https://cloudresourcemanager.googleapis.com/v1/projects/{project}:testIamPermissions",
                         {"permissions": list(permissions)})
        return set(doc.get("permissions", []))

    def publicly_readable(self, bucket: str, prefix: str) -> bool:
        """See GcpApi: an object listing asked without credentials."""
        resp = self._anonymous.get(f"https://storage.googleapis.com/storage/v1/b/{bucket}/o",
                                   params={"prefix": prefix, "maxResults": 1}, timeout=30)
        return resp.status_code == 200

    def network(self, project: str, name: str) -> dict | None:
        """See GcpApi."""
        return self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}/global/networks/{name}",
                         absent_ok=True)

    def routes(self, project: str) -> list[dict]:
        """See GcpApi."""
        found: list[dict] = []
        token = None
        while True:
            doc = self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}/global/routes",
                            {"maxResults": 500, **({"pageToken": token} if token else {})})
            found += doc.get("items", [])
            token = doc.get("nextPageToken")
            if not token:
                return found

    def service_quota_limits(self, project: str, service: str, metric: str) -> dict[str, float] | None:
        """See GcpApi: Service Usage's ConsumerQuotaMetric (v1beta1) of the metric; its per-region limit (unit
        `1/{project}/{region}`), whose quota buckets are ordered from the global default to a region's own."""
        from urllib.parse import quote

        doc = self._get(f"https://serviceusage.googleapis.com/v1beta1/projects/{project}/services/{service}/"
                        f"consumerQuotaMetrics/{quote(metric, safe='')}", absent_ok=True)
        if doc is None:
            return None
        limits = [q for q in doc.get("consumerQuotaLimits", []) if "{region}" in str(q.get("unit", ""))]
        if not limits:
            return None
        found: dict[str, float] = {}
        for bucket in limits[0].get("quotaBuckets", []):
            dimensions = bucket.get("dimensions") or {}
            if set(dimensions) <= {"region"}:  # the default, or a region's own (not a zone's or another kind's)
                found[dimensions.get("region", "")] = float(bucket.get("effectiveLimit", 0))
        return found

    def enabled_services(self, project: str) -> set[str]:
        """See GcpApi."""
        names: set[str] = set()
        token = None
        while True:
            params = {"filter": "state:ENABLED", "pageSize": 200, **({"pageToken": token} if token else {})}
            doc = self._get(f"https://serviceusage.googleapis.com/v1/projects/{project}/services", params)
            names |= {s["config"]["name"] for s in doc.get("services", [])}
            token = doc.get("nextPageToken")
            if not token:
                return names
