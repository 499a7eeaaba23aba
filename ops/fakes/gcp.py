"""Fake GCP for `ops synth`: resource outputs and lookups with well-formed, obviously fake values.

Names, self links and service account e-mails follow GCP's shapes inside the stack's
project (or `fake-project`); the image lookup answers with a fake accelerator image.
"""

from __future__ import annotations

from typing import Any

from ops.fakes.common import fake_hex

FAKE_GCP_IMAGE = "ubuntu-accelerator-2204-amd64-with-nvidia-550-v20260101"
INSTANCE_TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"


def project_number(project: str) -> str:
    """A fake project number (12 digits) for a project id: the same id gives the same number."""
    return str(int(fake_hex("project-number", project, n=12), 16) % 10**12).zfill(12)


def resource(t: str, name: str, inputs: dict[str, Any], h: str, project: str) -> tuple[str, dict[str, Any]]:
    """The fake id and the outputs beyond the inputs of one `gcp:` resource; `h` is its fake hex."""
    p, api = project, "https://www.googleapis.com/compute/v1"
    if t == "gcp:storage/bucket:Bucket":
        n = inputs.get("name") or f"{name}-{h[:7]}"
        return n, {"name": n, "url": f"gs://{n}", "selfLink": f"https://www.googleapis.com/storage/v1/b/{n}", "project": p}
    if t == "gcp:serviceaccount/account:Account":
        email = f"{inputs.get('accountId')}@{p}.iam.gserviceaccount.com"
        return f"projects/{p}/serviceAccounts/{email}", {
            "email": email, "name": f"projects/{p}/serviceAccounts/{email}",
            "member": f"serviceAccount:{email}", "uniqueId": str(int(h[:15], 16)), "project": p,
        }
    if t == "gcp:artifactregistry/repository:Repository":
        rid = f"projects/{p}/locations/{inputs.get('location')}/repositories/{inputs.get('repositoryId')}"
        return rid, {"name": inputs.get("repositoryId"), "project": p}
    if t == "gcp:compute/instanceTemplate:InstanceTemplate":
        n = f"{inputs.get('namePrefix') or name + '-'}{h[:12]}"
        link = f"{api}/projects/{p}/global/instanceTemplates/{n}"
        return f"projects/{p}/global/instanceTemplates/{n}", {
            "name": n, "selfLink": link, "selfLinkUnique": f"{link}?uniqueId={int(h[:15], 16)}", "project": p,
        }
    if t == "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager":
        n = inputs.get("name") or f"{name}-{h[:7]}"
        path = f"projects/{p}/regions/{inputs.get('region')}"
        return f"{path}/instanceGroupManagers/{n}", {
            "name": n, "selfLink": f"{api}/{path}/instanceGroupManagers/{n}",
            "instanceGroup": f"{api}/{path}/instanceGroups/{n}", "project": p,
        }
    if t == "gcp:iam/workloadIdentityPool:WorkloadIdentityPool":
        # Pools and providers are named by the project's number, which the fake derives from its id.
        n = f"projects/{project_number(p)}/locations/global/workloadIdentityPools/{inputs.get('workloadIdentityPoolId')}"
        return n, {"name": n, "state": "ACTIVE", "project": p}
    if t == "gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider":
        n = (f"projects/{project_number(p)}/locations/global/workloadIdentityPools/"
             f"{inputs.get('workloadIdentityPoolId')}/providers/{inputs.get('workloadIdentityPoolProviderId')}")
        return n, {"name": n, "state": "ACTIVE", "project": p}
    if t == "gcp:projects/iAMCustomRole:IAMCustomRole":
        n = f"projects/{p}/roles/{inputs.get('roleId')}"
        return n, {"name": n}
    if t == "gcp:cloudfunctionsv2/function:Function":
        n, loc = inputs.get("name") or f"{name}-{h[:7]}", inputs.get("location")
        url = f"https://{n}-{h[:10]}-{loc}.a.run.app"
        return f"projects/{p}/locations/{loc}/functions/{n}", {
            "name": n, "url": url, "state": "ACTIVE", "project": p,
            "serviceConfig": {**(inputs.get("serviceConfig") or {}), "service": f"projects/{p}/locations/{loc}/services/{n}",
                              "uri": url},
        }
    if t == "gcp:projects/serviceIdentity:ServiceIdentity":
        # A service's agent is named by the project's number and the service's first word.
        email = f"service-{project_number(p)}@gcp-sa-{str(inputs.get('service')).split('.')[0]}.iam.gserviceaccount.com"
        return f"projects/{p}/services/{inputs.get('service')}", {"email": email, "member": f"serviceAccount:{email}"}
    if t == "gcp:kms/keyRing:KeyRing":
        n = f"projects/{inputs.get('project') or p}/locations/{inputs.get('location')}/keyRings/{inputs.get('name')}"
        return n, {}
    if t == "gcp:kms/cryptoKey:CryptoKey":
        n = f"{inputs.get('keyRing')}/cryptoKeys/{inputs.get('name')}"
        return n, {"primary": [], "effectiveLabels": inputs.get("labels") or {}}
    if t == "gcp:kms/cryptoKeyVersion:CryptoKeyVersion":
        n = f"{inputs.get('cryptoKey')}/cryptoKeyVersions/1"
        return n, {"name": n, "state": "ENABLED", "algorithm": "EC_SIGN_P256_SHA256", "protectionLevel": "SOFTWARE"}
    if t == "gcp:storage/bucketObject:BucketObject":
        return f"{inputs.get('bucket')}-{inputs.get('name')}", {
            "selfLink": f"https://www.googleapis.com/storage/v1/b/{inputs.get('bucket')}/o/{inputs.get('name')}",
            "md5hash": h[:22], "generation": int(h[:12], 16),
        }
    return f"{name}-{h[:7]}", {"project": p} if "project" not in inputs else {}


def call(fn: str, a: dict[str, Any], region: str, project: str) -> dict[str, Any] | None:
    """The fake answer to one `gcp:` lookup, or None when there is none."""
    if fn == "gcp:compute/getImage:getImage":
        image_project = a.get("project") or "ubuntu-os-accelerator-images"
        image = a.get("name") or FAKE_GCP_IMAGE
        return {
            "id": f"projects/{image_project}/global/images/{image}", "name": image, "family": a.get("family"),
            "project": image_project, "status": "READY",
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{image_project}/global/images/{image}",
        }
    if fn == "gcp:compute/getZones:getZones":
        # Four zones, as us-central1 has: more than the three GCE would pick by itself.
        r = a.get("region") or region
        return {"id": f"projects/{a.get('project') or project}/regions/{r}", "names": [f"{r}-{z}" for z in "abcf"],
                "project": a.get("project") or project, "region": r}
    if fn == "gcp:organizations/getProject:getProject":
        p = a.get("projectId") or project
        return {"id": f"projects/{p}", "projectId": p, "number": project_number(p), "name": p, "labels": {}}
    if fn == "gcp:organizations/getClientOpenIdUserInfo:getClientOpenIdUserInfo":
        # The account `pulumi up` runs as: a user here (a deployer's own gcloud login).
        return {"id": "synth@example.com", "email": "synth@example.com"}
    if fn == "gcp:organizations/getClientConfig:getClientConfig":
        return {
            "id": f"projects/{project}/regions/{region}/zones/{region}-a",
            "accessToken": f"ya29.fake-access-token-{fake_hex(fn, project, n=32)}",
            "project": project, "region": region, "zone": f"{region}-a", "defaultLabels": {},
        }
    return None
