"""Preflight on GCP: GPU quotas, machine types in the group's zones, the network, the data bucket, the APIs.

Each check reads the project through a `GcpApi` (`ops.preflight.gcp_api`: REST with
Application Default Credentials, a fake in tests) and returns `Problem`s; `check_gcp` runs
them all for one project and region. What each check asks is in `ops.preflight`'s docstring.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from components import settings as config
from ops.preflight.common import NoCredentials, Problem, run_checks
from ops.preflight.gcp_api import COMPUTE_API, ApiDisabled, GcpApi, RestGcpApi

# GCE machine family (or N1 accelerator) -> the GPU quota metric of its GPUs.
GCP_GPU_METRICS: list[tuple[str, str]] = [
    (r"^g2-", "NVIDIA_L4_GPUS"),
    (r"^a2-ultragpu-", "NVIDIA_A100_80GB_GPUS"),
    (r"^a2-", "NVIDIA_A100_GPUS"),
    (r"^a3-megagpu-", "NVIDIA_H100_MEGA_GPUS"),
    (r"^a3-", "NVIDIA_H100_GPUS"),
]
GCP_ACCELERATOR_METRICS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-k80": "NVIDIA_K80_GPUS",
}


def gcp_gpu_metric(machine_type: str, accelerator: str | None) -> str | None:
    """The quota metric of the GPUs a machine type has (or its N1 accelerator); None when unknown."""
    if machine_type.startswith("n1-"):
        return GCP_ACCELERATOR_METRICS.get(accelerator or "")
    return next((metric for pattern, metric in GCP_GPU_METRICS if re.match(pattern, machine_type)), None)


def gcp_gpu_quota(metric: str, region: dict[str, tuple[float, float]], *, spot: bool) -> str:
    """The region quota the group's GPUs draw on: Spot VMs use the PREEMPTIBLE_ one where the project
    has been granted any, else the standard one (Compute Engine's preemptible-quota rule)."""
    preemptible = f"PREEMPTIBLE_{metric}"
    if spot and region.get(preemptible, (0.0, 0.0))[0] > 0:
        return preemptible
    return metric


def gcp_quota_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """The region's GPU quota for each GPU the stack uses, and the project's all-regions GPU quota."""
    c = settings.compute
    need = c.gpus_per_node * c.nodes
    region = api.region_quotas(settings.project, settings.region)
    problems = []
    metrics = sorted({m for t in c.instance_types if (m := gcp_gpu_metric(t, c.accelerator))})
    for metric in metrics:
        name, note = gcp_gpu_quota(metric, region, spot=c.spot), ""
        if name != f"PREEMPTIBLE_{metric}" and c.spot:
            note = f" (Spot VMs use it while PREEMPTIBLE_{metric} is 0)"
        limit, used = region.get(name, (0.0, 0.0))
        if limit - used < need:
            problems.append(Problem(
                f"GPU quota {name} in {settings.region} is {limit:g}{_in_use(used)}{note}; the stack needs {need} "
                f"({c.gpus_per_node} per node x {c.nodes} node(s)), so no machine would start",
                f"request {need + used:g} in the console (IAM & Admin > Quotas, metric compute.googleapis.com/"
                f"{name.lower()}, region {settings.region})",
            ))
    limit, used = api.project_quotas(settings.project).get("GPUS_ALL_REGIONS", (0.0, 0.0))
    if limit - used < need:
        problems.append(Problem(
            f"GPU quota GPUS_ALL_REGIONS of project {settings.project} is {limit:g}{_in_use(used)}; "
            f"the stack needs {need}",
            f"request {need + used:g} 'GPUs (all regions)' in IAM & Admin > Quotas (new projects start at 0)",
        ))
    return problems


def _in_use(used: float) -> str:
    return f" with {used:g} in use" if used else ""


_GCLOUD_LIST = {"machineTypes": "machine-types", "acceleratorTypes": "accelerator-types"}


def gcp_zones(settings: config.Settings, api: GcpApi) -> list[str]:
    """The zones the group may use, as the program sets them: compute.zones, else every zone of the region."""
    return list(settings.compute.zones) or api.region_zones(settings.project, settings.region)


def gcp_offering_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """Machine types (and an N1 machine's GPU) offered in none of the zones the group may use
    (it picks one zone among them that has the hardware and capacity)."""
    c = settings.compute
    zones = gcp_zones(settings, api)
    wanted = [("machineTypes", t, "compute.instanceTypes") for t in c.instance_types]
    if c.accelerator:
        wanted.append(("acceleratorTypes", c.accelerator, "compute.accelerator"))
    problems = []
    for kind, name, key in wanted:
        if not any(api.offered(settings.project, z, kind, name) for z in zones):
            problems.append(Problem(f"{name} ({key}) is offered in none of the zones {', '.join(zones)}",
                                    f"choose a {key} or compute.zones the region offers "
                                    f"(gcloud compute {_GCLOUD_LIST[kind]} list --filter='name={name}')"))
    return problems


SET_POLICY = "storage.buckets.setIamPolicy"


def gcp_network_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """The `default` network the machines use: it exists, has a subnet in the region, and a 0.0.0.0/0
    route to the internet gateway for the machines (their ephemeral public address reaches the bucket,
    the registry and the package index through it).

    Organizations often create projects without a `default` network (the policy
    `compute.skipDefaultNetworkCreation`): `pulumi up` would then create the bucket and the identity
    and fail at the firewall rules. A route through another next hop (an appliance, a load balancer)
    cannot be judged from here and passes; a route with tags serves only machines with one of them.
    """
    from components.gcp.naming import MACHINE_NETWORK, network_tag
    from ops.mockrun import project_name

    project, region = settings.project, settings.region
    net = api.network(project, MACHINE_NETWORK)
    if net is None:
        return [Problem(f"project {project} has no VPC network named {MACHINE_NETWORK!r}, which the machines and "
                        "their firewall rules use (organizations often skip it: compute.skipDefaultNetworkCreation)",
                        f"gcloud compute networks create {MACHINE_NETWORK} --subnet-mode=auto --project {project}")]
    if not any(f"/regions/{region}/subnetworks/" in url for url in net.get("subnetworks", [])):
        return [Problem(f"network {MACHINE_NETWORK} of project {project} has no subnet in {region}, so no machine "
                        "can start there",
                        f"gcloud compute networks subnets create {MACHINE_NETWORK}-{region} --network "
                        f"{MACHINE_NETWORK} --region {region} --range 10.128.0.0/20 --project {project} "
                        "(a range free in the network)")]
    tag = network_tag(project=project_name(), stack=settings.stack)
    for route in api.routes(project):
        if (str(route.get("network", "")).endswith(f"/global/networks/{MACHINE_NETWORK}")
                and route.get("destRange") == "0.0.0.0/0" and (not route.get("tags") or tag in route["tags"])):
            return []
    return [Problem(f"network {MACHINE_NETWORK} of project {project} has no 0.0.0.0/0 route for the machines: "
                    "they could not reach the bucket, the registry or the package index, and every boot would "
                    "wait out its bounds until the runtime cap",
                    f"gcloud compute routes create {MACHINE_NETWORK}-internet --network {MACHINE_NETWORK} "
                    f"--destination-range 0.0.0.0/0 --next-hop-gateway default-internet-gateway --project {project}")]


def gcp_data_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """A gs:// dataUri: the bucket exists, and with run.dataGrant the deployer may set its IAM policy.

    `pulumi up` grants the machines read access on the data bucket itself; without
    storage.buckets.setIamPolicy there (a public data set of another project, a bucket another
    team owns) the grant fails with 403 after the other resources were made.
    """
    from components.gcp.naming import service_account_id, split_gs_uri
    from ops.mockrun import project_name

    uri = settings.run.data_uri
    if not uri or not uri.startswith("gs://"):
        return []
    bucket, prefix = split_gs_uri(uri)
    granted = api.bucket_permissions(bucket, [SET_POLICY])
    if granted is None:
        return [Problem(f"run.dataUri {uri}: there is no bucket {bucket}", "check run.dataUri")]
    if not settings.run.data_grant or SET_POLICY in granted:
        return []
    account = (f"{service_account_id(project=project_name(), stack=settings.stack)}@{settings.project}"
               ".iam.gserviceaccount.com")
    what = (f"you cannot set the IAM policy of data bucket {bucket} ({SET_POLICY}), so `pulumi up` would fail "
            "granting the machines read access to it (403)")
    if api.publicly_readable(bucket, prefix):
        return [Problem(f"{what}; it is publicly readable, so they need no grant", "set run.dataGrant: false")]
    return [Problem(what, f"ask its owner to grant roles/storage.objectViewer on gs://{bucket} to "
                          f"serviceAccount:{account} and set run.dataGrant: false, or get "
                          "roles/storage.admin on that bucket")]


# What `pulumi up` and `pulumi destroy` do in Cloud KMS for the image-signing key (components/gcp/signing_key.py),
# through pulumi_gcp: create the key ring, the key and its one version and read them back on every up; grant the
# deployer on the key (CryptoKeyIAMMember reads and sets the key's policy); on destroy, destroy the version, and
# the key's deletion destroys every version it lists and clears its rotation (an update). Key rings and keys are
# never deleted. The deployer's signing and public-key reads (useToSign, viewPublicKey) are not asked here: the
# stack grants them on the key itself (the setIamPolicy above), and the usual roles of a key administrator
# (roles/cloudkms.admin) carry no cryptographic operation.
SIGNING_PERMISSIONS = (
    "cloudkms.keyRings.create", "cloudkms.keyRings.get",
    "cloudkms.cryptoKeys.create", "cloudkms.cryptoKeys.get", "cloudkms.cryptoKeys.update",
    "cloudkms.cryptoKeys.getIamPolicy", "cloudkms.cryptoKeys.setIamPolicy",
    "cloudkms.cryptoKeyVersions.create", "cloudkms.cryptoKeyVersions.get", "cloudkms.cryptoKeyVersions.list",
    "cloudkms.cryptoKeyVersions.destroy",
)


def gcp_signing_key_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """With `image.build`, whether the account running `pulumi up` may create, grant on and destroy the
    image-signing key in the project: Cloud Resource Manager's projects.testIamPermissions, which counts the roles
    it holds on the project and those it inherits (the key ring is new: nothing is granted on it yet).

    Cloud KMS's API need not be on for the question: `pulumi up` turns it on (with image.build)."""
    if not settings.image.build:
        return []
    granted = api.project_permissions(settings.project, list(SIGNING_PERMISSIONS))
    missing = [p for p in SIGNING_PERMISSIONS if p not in granted]
    if not missing:
        return []
    return [Problem(
        f"image.build: you may not {', '.join(missing)} in project {settings.project} (testIamPermissions), so "
        "`pulumi up` would fail at the image-signing key after the bucket, repository and image exist (or "
        "`pulumi destroy` at its version)",
        f"gcloud projects add-iam-policy-binding {settings.project} --member=user:YOU (or serviceAccount:...) "
        "--role=roles/cloudkms.admin, or a custom role with those permissions")]


def gcp_api_problems(settings: config.Settings, enabled: set[str]) -> list[Problem]:
    """The APIs that must be on before the first `pulumi up` (components/gcp/naming.py PREREQUISITE_APIS),
    of the project's `enabled` services."""
    from components.gcp.naming import PREREQUISITE_APIS

    missing = [a for a in PREREQUISITE_APIS if a not in enabled]
    if not missing:
        return []
    return [Problem(f"API(s) {', '.join(missing)} off in project {settings.project}; the stack cannot turn "
                    "on the others without them",
                    f"gcloud services enable {' '.join(missing)} --project {settings.project}")]


def compute_api_problem(settings: config.Settings) -> Problem:
    """The Compute Engine API is off: the quotas and machine types cannot be read until it is on."""
    return Problem(f"the Compute Engine API ({COMPUTE_API}) is off in project {settings.project}, so its GPU "
                   "quotas and machine types cannot be checked (`pulumi up` would turn it on, but a new project's "
                   "GPU quota is 0 until you ask)",
                   f"gcloud services enable {COMPUTE_API} --project {settings.project}, then run preflight again")


def api_checks(settings: config.Settings, api: GcpApi) -> tuple[list[Problem], set[str]]:
    """The prerequisite APIs' check: its problems, and the services it found on (none when it could not read them)."""
    enabled: set[str] = set()

    def apis() -> list[Problem]:
        enabled.update(api.enabled_services(settings.project))
        return gcp_api_problems(settings, enabled)

    return run_checks([("APIs", off_api_said(settings, apis))], _gcp_error), enabled


def check_gcp(settings: config.Settings, api: GcpApi | None = None, *, home: bool = True) -> list[Problem]:
    """Every GCP check; `api` defaults to the REST client with Application Default Credentials.

    `home=False`: a placement's project and region, whose run and data are home's: no data check there."""
    api = gcp_api(api)
    problems, enabled = api_checks(settings, api)
    if enabled and COMPUTE_API not in enabled:
        # Every read below goes to the Compute Engine API: one line says to turn it on.
        return [*problems, compute_api_problem(settings)]
    checks: list[tuple[str, Callable[[], list[Problem]]]] = [
        ("GPU quota", off_api_said(settings, lambda: gcp_quota_problems(settings, api))),
        ("machine types", off_api_said(settings, lambda: gcp_offering_problems(settings, api))),
        ("network", off_api_said(settings, lambda: gcp_network_problems(settings, api))),
    ]
    if home:
        checks.append(("data bucket", off_api_said(settings, lambda: gcp_data_problems(settings, api))))
        if settings.image.build:
            checks.append(("image signing key", off_api_said(settings, lambda: gcp_signing_key_problems(settings, api))))
    return merge(problems, run_checks(checks, _gcp_error))


def merge(problems: list[Problem], more: list[Problem]) -> list[Problem]:
    """`problems` and then `more`, each said once: an API that is off refuses every check the same way."""
    return problems + [p for i, p in enumerate(more) if p not in problems and p not in more[:i]]


def off_api_said(settings: config.Settings, check: Callable[[], list[Problem]]) -> Callable[[], list[Problem]]:
    """`check`, where a read of an API that is off is no credentials problem: one line says which API to turn on."""
    def run() -> list[Problem]:
        try:
            return check()
        except ApiDisabled as e:
            if e.service == COMPUTE_API:
                return [compute_api_problem(settings)]
            return [Problem(f"the API {e.service} is off in project {settings.project} ({e})",
                            f"gcloud services enable {e.service} --project {settings.project}, "
                            "then run preflight again")]
    return run


def gcp_api(api: GcpApi | None = None) -> GcpApi:
    """`api`, else the REST client with Application Default Credentials; `NoCredentials` when there are none."""
    if api is None:
        import google.auth.exceptions

        try:
            api = RestGcpApi()
        except google.auth.exceptions.DefaultCredentialsError as e:
            named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
            if named:
                # The variable names a file google-auth cannot use: say which, in google-auth's first line.
                raise NoCredentials("Google Cloud", f"GOOGLE_APPLICATION_CREDENTIALS={named}: "
                                    f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}",
                                    "point it at a key file, or unset it and run "
                                    "`gcloud auth application-default login`") from e
            raise NoCredentials("Google Cloud", "Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, "
                                "gcloud's application-default login, the metadata server",
                                "run `gcloud auth application-default login`") from e
    return api


def _gcp_error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"
