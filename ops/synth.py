"""Offline synth: run the Pulumi program (`__main__.py`) under the SDK's mock runtime.

No cloud account, no credentials and no Pulumi CLI: the stack's file from `stacks/`
becomes the SDK's config, the program runs exactly as `pulumi up` would run it, and every
resource it registers is recorded with its inputs (camelCase, as the engine sees them)
and its resource options. Lookups (AMI, default VPC, subnets, account, partition,
region, zones; the GCE image) answer with clearly fake, well-formed values.

`synthesize()` can run many times in one process: each run gets a fresh context for
the SDK's global state (settings, config, root stack), its own event loop and its own
mock monitor, and waits for every output before returning.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import hashlib
import json
import logging
import math
import runpy
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_in_stack
from pulumi.runtime.sync_await import _ensure_event_loop

from components import settings as config
from components import userdata

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PROGRAM = PROJECT_ROOT / "__main__.py"
STACKS_DIR = PROJECT_ROOT / "stacks"

FAKE_ACCOUNT = "123456789012"
FAKE_AMI = "ami-0123456789abcdef0"
FAKE_VPC = "vpc-0123456789abcdef0"
FAKE_GCP_IMAGE = "ubuntu-accelerator-2204-amd64-with-nvidia-550-v20260101"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE_TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
DOCKER_IMAGE = "docker-build:index:Image"

log = logging.getLogger("ops.synth")


def project_name() -> str:
    """The project's name from Pulumi.yaml (what `pulumi.get_project()` returns)."""
    doc = yaml.safe_load((PROJECT_ROOT / "Pulumi.yaml").read_text()) or {}
    return str(doc.get("name") or "trainstack")


class ProgramError(RuntimeError):
    """The program failed under the mocks; `resources` is what it registered before failing."""

    def __init__(self, message: str, resources: list[dict[str, Any]]):
        super().__init__(message)
        self.resources = resources


@dataclass
class Result:
    """What one synth run registered."""

    resources: list[dict[str, Any]]
    """[{"type", "name", "parent", "inputs", "options"}], sorted by name and type."""
    outputs: dict[str, Any]
    """The stack outputs, resolved."""
    user_data: dict[str, str]
    """Launch template (AWS) / instance template (GCP) resource name -> its user data, decoded."""
    invokes: list[dict[str, Any]] = field(default_factory=list)
    """[{"token", "args", "provider"}]: the lookups the program made."""

    def of_type(self, type_token: str) -> list[dict[str, Any]]:
        """The resources of one type token, e.g. aws:s3/bucket:Bucket."""
        return [r for r in self.resources if r["type"] == type_token]

    def named(self, name: str) -> dict[str, Any]:
        """The one resource with this name."""
        found = [r for r in self.resources if r["name"] == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} resources named {name!r}")
        return found[0]


def _jsonable(value: Any) -> Any:
    """Inputs as plain JSON: assets become {"fileAsset": path} etc., whole floats become ints."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        # The wire format has only doubles; 200.0 GiB is the 200 the program wrote.
        return int(value) if math.isfinite(value) and value.is_integer() else value
    if isinstance(value, pulumi.FileAsset):
        return {"fileAsset": str(value.path)}
    if isinstance(value, pulumi.StringAsset):
        return {"stringAsset": value.text}
    if isinstance(value, pulumi.FileArchive):
        return {"fileArchive": str(value.path)}
    if isinstance(value, pulumi.Resource):
        return {"resource": type(value).__name__}
    return str(value)


def _urn_name(urn: str) -> str:
    return urn.split("::")[3] if urn.count("::") >= 3 else urn


def _fake_hex(*parts: str, n: int = 17) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:n]


class _Mocks(pulumi.runtime.Mocks):
    """Fake AWS: resource outputs and lookups with well-formed, obviously fake values."""

    def __init__(self, region: str, gcp_project: str = ""):
        self.region = region
        self.gcp_project = gcp_project or "fake-project"
        self.invokes: list[dict[str, Any]] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        t, name, inputs = args.typ, args.name, dict(args.inputs)
        if not args.custom:
            return None, {}
        arn = f"arn:aws:{{svc}}:{self.region}:{FAKE_ACCOUNT}:"
        h = _fake_hex(t, name)
        out = dict(inputs)
        rid = f"{name}-{h[:7]}"
        if t == "aws:s3/bucket:Bucket":
            bucket = inputs.get("bucket") or rid
            rid = bucket
            out.update(bucket=bucket, arn=f"arn:aws:s3:::{bucket}", region=self.region)
        elif t in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
            kind = "role" if t.endswith(":Role") else "instance-profile"
            n = inputs.get("name") or rid
            rid = n
            out.update(name=n, arn=f"arn:aws:iam::{FAKE_ACCOUNT}:{kind}/{n}", uniqueId=f"AROA{h[:16].upper()}")
        elif t == "aws:ecr/repository:Repository":
            n = inputs.get("name") or rid
            rid = n
            out.update(
                name=n,
                arn=arn.format(svc="ecr") + f"repository/{n}",
                repositoryUrl=f"{FAKE_ACCOUNT}.dkr.ecr.{self.region}.amazonaws.com/{n}",
                registryId=FAKE_ACCOUNT,
            )
        elif t == LAUNCH_TEMPLATE:
            rid = f"lt-{h}"
            out.update(arn=arn.format(svc="ec2") + f"launch-template/{rid}", latestVersion=1, defaultVersion=1)
        elif t == "aws:ec2/securityGroup:SecurityGroup":
            rid = f"sg-{h}"
            out.update(arn=arn.format(svc="ec2") + f"security-group/{rid}", name=rid)
        elif t == "aws:ec2/keyPair:KeyPair":
            rid = inputs.get("keyName") or rid
            out.update(keyName=rid, arn=arn.format(svc="ec2") + f"key-pair/{rid}")
        elif t == "aws:autoscaling/group:Group":
            n = inputs.get("name") or rid
            rid = n
            uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-0000-{_fake_hex(name, n=12)}"
            out.update(name=n, arn=arn.format(svc="autoscaling") + f"autoScalingGroup:{uuid}:autoScalingGroupName/{n}")
        elif t == "aws:s3/bucketObjectv2:BucketObjectv2":
            out.update(versionId=h, etag=h)
        elif t == DOCKER_IMAGE:
            # A pushed image: its digest follows from what was built (tags, context, Dockerfile).
            digest = "sha256:" + hashlib.sha256(json.dumps(_jsonable(inputs), sort_keys=True).encode()).hexdigest()
            tags = list(inputs.get("tags") or [])
            rid = digest
            out.update(digest=digest, ref=f"{tags[0]}@{digest}" if tags else "", contextHash=h)
        elif t.startswith("gcp:"):
            rid, extra = self._gcp_resource(t, name, inputs, h)
            out.update(extra)
        elif t.startswith("pulumi:providers:"):
            rid = f"{name}-provider-id"
        return rid, out

    def _gcp_resource(self, t: str, name: str, inputs: dict, h: str) -> tuple[str, dict]:
        p, api = self.gcp_project, "https://www.googleapis.com/compute/v1"
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
        if t == "gcp:projects/iAMCustomRole:IAMCustomRole":
            n = f"projects/{p}/roles/{inputs.get('roleId')}"
            return n, {"name": n}
        if t == "gcp:storage/bucketObject:BucketObject":
            return f"{inputs.get('bucket')}-{inputs.get('name')}", {
                "selfLink": f"https://www.googleapis.com/storage/v1/b/{inputs.get('bucket')}/o/{inputs.get('name')}",
                "md5hash": h[:22], "generation": int(h[:12], 16),
            }
        return f"{name}-{h[:7]}", {"project": p} if "project" not in inputs else {}

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        fn, a = args.token, dict(args.args)
        self.invokes.append({"token": fn, "args": _jsonable(a), "provider": _urn_name(args.provider or "") or None})
        zones = [f"{self.region}{z}" for z in "abc"]
        if fn == "aws:ec2/getAmi:getAmi":
            wanted = [v for f in a.get("filters") or [] if f.get("name") == "image-id" for v in f.get("values", [])]
            ami = wanted[0] if wanted else FAKE_AMI
            return {
                "id": ami, "imageId": ami, "architecture": "x86_64", "rootDeviceName": "/dev/sda1",
                "name": "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20260101 (fake)",
                "ownerId": "898082745236", "state": "available", "virtualizationType": "hvm",
            }
        if fn == "aws:ec2/getVpc:getVpc":
            return {"id": FAKE_VPC, "default": True, "cidrBlock": "172.31.0.0/16", "state": "available"}
        if fn == "aws:ec2/getSubnets:getSubnets":
            filters = {f.get("name"): list(f.get("values", [])) for f in a.get("filters") or []}
            chosen = filters.get("availability-zone") or zones
            ids = [f"subnet-{_fake_hex(z)}" for z in chosen if z in zones]
            return {"id": self.region, "ids": ids, "filters": a.get("filters")}
        if fn == "aws:ec2/getSubnet:getSubnet":
            return {"id": a.get("id"), "vpcId": FAKE_VPC, "availabilityZone": zones[0]}
        if fn == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "accountId": FAKE_ACCOUNT, "id": FAKE_ACCOUNT,
                "arn": f"arn:aws:iam::{FAKE_ACCOUNT}:user/synth", "userId": "AIDAFAKEFAKEFAKEFAKE",
            }
        if fn == "aws:index/getPartition:getPartition":
            return {"id": "aws", "partition": "aws", "dnsSuffix": "amazonaws.com", "reverseDnsPrefix": "com.amazonaws"}
        if fn == "aws:index/getRegion:getRegion":
            return {"id": self.region, "name": self.region, "region": self.region,
                    "endpoint": f"ec2.{self.region}.amazonaws.com"}
        if fn == "gcp:compute/getImage:getImage":
            project = a.get("project") or "ubuntu-os-accelerator-images"
            image = a.get("name") or FAKE_GCP_IMAGE
            return {
                "id": f"projects/{project}/global/images/{image}", "name": image, "family": a.get("family"),
                "project": project, "status": "READY",
                "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/global/images/{image}",
            }
        if fn == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            registry = a.get("registryId") or FAKE_ACCOUNT
            password = f"fake-ecr-token-{_fake_hex(fn, registry, n=32)}"
            return {
                "id": self.region, "registryId": registry, "region": self.region, "userName": "AWS",
                "password": password, "authorizationToken": base64.b64encode(f"AWS:{password}".encode()).decode(),
                "proxyEndpoint": f"https://{registry}.dkr.ecr.{self.region}.amazonaws.com",
                "expiresAt": "2030-01-01T12:00:00Z",
            }
        if fn == "gcp:organizations/getClientConfig:getClientConfig":
            return {
                "id": f"projects/{self.gcp_project}/regions/{self.region}/zones/{self.region}-a",
                "accessToken": f"ya29.fake-access-token-{_fake_hex(fn, self.gcp_project, n=32)}",
                "project": self.gcp_project, "region": self.region, "zone": f"{self.region}-a", "defaultLabels": {},
            }
        if fn == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"id": self.region, "names": zones, "zoneIds": [f"use1-az{i}" for i in range(1, 4)]}
        # An unknown lookup would silently return nothing; fail loudly instead.
        raise NotImplementedError(f"ops synth has no fake answer for {fn}")


class _Monitor(pulumi_mocks.MockMonitor):
    """The SDK's mock monitor, also recording each registration's options.

    The mock runtime hands `Mocks.new_resource` only the inputs; options such as
    retainOnDelete and ignoreChanges travel in the same request, so they are read here.
    """

    def __init__(self, mocks: _Mocks):
        super().__init__(mocks)
        self.records: list[dict[str, Any]] = []
        self.root_urn: str | None = None
        self.stack_outputs: dict[str, Any] = {}
        self.thread_loops: set[asyncio.AbstractEventLoop] = set()

    def _track_loop(self) -> None:
        # The SDK gives each worker thread its own event loop and never closes it; closed
        # here after the run, they would otherwise be torn down by the garbage collector
        # at random times with noisy errors.
        self.thread_loops.add(_ensure_event_loop())

    def Invoke(self, request):  # noqa: N802 - gRPC method name
        self._track_loop()
        return super().Invoke(request)

    def RegisterResourceOutputs(self, request):  # noqa: N802 - gRPC method name
        # The root stack's outputs are the program's exports, as the engine receives them.
        self._track_loop()
        if request.urn == self.root_urn:
            self.stack_outputs = rpc.deserialize_properties(request.outputs)
        return super().RegisterResourceOutputs(request)

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        self._track_loop()
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            self.root_urn = response.urn
            return response
        inputs = rpc.deserialize_properties(request.object)
        self.records.append(
            {
                "type": request.type,
                "name": request.name,
                "parent": request.parent or None,
                "inputs": _jsonable(inputs),
                "options": {
                    "retainOnDelete": bool(request.retainOnDelete),
                    "protect": bool(request.protect),
                    "ignoreChanges": list(request.ignoreChanges),
                    "deleteBeforeReplace": bool(request.deleteBeforeReplace),
                    "replaceOnChanges": list(request.replaceOnChanges),
                    "provider": _urn_name(request.provider) if request.provider else None,
                    "dependsOn": sorted(_urn_name(d) for d in request.dependencies),
                    "custom": bool(request.custom),
                },
            }
        )
        return response


def config_for_sdk(doc_config: Mapping[str, Any]) -> dict[str, str]:
    """Stack-file config as the SDK holds it: strings, objects as JSON."""
    out = {}
    for k, v in doc_config.items():
        if isinstance(v, Mapping | list):
            out[str(k)] = json.dumps(v)
        elif isinstance(v, bool):
            out[str(k)] = "true" if v else "false"
        else:
            out[str(k)] = str(v)
    return out


def load_source(source: str | Path | Mapping[str, Any], stack: str | None = None) -> tuple[config.Settings, dict[str, Any]]:
    """Validated settings and the full config mapping of a stack file or raw settings.

    `source` is a path to `Pulumi.<stack>.yaml`, or a mapping of un-namespaced trainstack
    keys (cloud, region, run, ...). Raises `ConfigError` (one line naming the key).
    """
    if isinstance(source, Mapping):
        name = stack or "test"
        raw = dict(source)
        full = {f"{config.NAMESPACE}:{k}": v for k, v in raw.items()}
    else:
        path = Path(source)
        name = stack or path.name.removeprefix("Pulumi.").removesuffix(".yaml")
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise config.ConfigError("config", f"{path.name} is not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(doc, Mapping):
            raise config.ConfigError("config", f"{path.name}: expected a mapping with a config: block")
        raw = config.raw_from_stack_file(path)
        full = dict(doc.get("config") or {})
    return config.load_settings(raw, stack=name), full


def synthesize(source: str | Path | Mapping[str, Any], *, stack: str | None = None) -> Result:
    """Run the Pulumi program for a stack file (or raw settings) under mocks; see module doc.

    Raises `ConfigError` before anything runs when the config is invalid.
    """
    settings, full_config = load_source(source, stack)
    return run_program(config_for_sdk(full_config), stack=settings.stack, region=settings.region,
                       gcp_project=settings.project)


def run_program(sdk_config: Mapping[str, str], *, stack: str, region: str, gcp_project: str = "") -> Result:
    """Run `__main__.py` with this SDK config as-is (no validation first) under mocks.

    `synthesize` is the usual entry; this one also shows what the program itself does
    with a config that is wrong. Fake lookups answer for `region`.
    """
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    # The SDK keeps its settings, config and root stack in context variables: a copied
    # context gives this run its own and leaves the caller's untouched.
    ctx = contextvars.copy_context()
    return ctx.run(_run, dict(sdk_config), stack, region, gcp_project)


def _run(sdk_config: dict[str, str], stack: str, region: str, gcp_project: str) -> Result:
    project = project_name()
    pulumi_settings.reset_options(project=project, stack=stack, preview=False)
    set_all_config(sdk_config, [])
    mocks = _Mocks(region, gcp_project)
    monitor = _Monitor(mocks)
    # What `pulumi.runtime.set_mocks` installs (MockSettings around a MockMonitor), minus
    # the root stack it also creates: `run_in_stack` below makes the root and awaits every
    # output, as the Python language host does for `pulumi up`.
    pulumi_settings.configure(
        pulumi_mocks.MockSettings(
            monitor=monitor,
            monitor_features=set(monitor.GetDeploymentInfo(None).supportedFeatures),
            engine=pulumi_mocks.MockEngine(log),
            project=project,
            stack=stack,
            dry_run=False,
            organization="organization",
            root_directory=str(PROJECT_ROOT),
            callbacks=None,
        )
    )
    loop = asyncio.new_event_loop()
    # A failed program leaves futures whose errors are already raised from the run itself.
    loop.set_exception_handler(lambda _loop, context: log.debug("after the run: %s", context.get("message")))
    try:
        loop.run_until_complete(run_in_stack(lambda: runpy.run_path(str(PROGRAM), run_name="__main__")))
    except Exception as e:
        raise ProgramError(str(e), _resolve_parents(monitor)) from e
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                loop.run_until_complete(task)
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        for thread_loop in monitor.thread_loops:
            if thread_loop is not loop and not thread_loop.is_closed():
                thread_loop.close()

    resources = _resolve_parents(monitor)
    user_data = {}
    for r in resources:
        if r["type"] == LAUNCH_TEMPLATE and r["inputs"].get("userData"):
            user_data[r["name"]] = userdata.decode_user_data(r["inputs"]["userData"])
        elif r["type"] == INSTANCE_TEMPLATE and (r["inputs"].get("metadata") or {}).get("user-data"):
            user_data[r["name"]] = r["inputs"]["metadata"]["user-data"]
    return Result(resources=resources, outputs=_jsonable(monitor.stack_outputs), user_data=user_data, invokes=mocks.invokes)


def _resolve_parents(monitor: _Monitor) -> list[dict[str, Any]]:
    """The records with parents as names (None for top-level), sorted by name and type."""
    resources = []
    for r in monitor.records:
        parent = r["parent"]
        resources.append({**r, "parent": None if parent in (None, monitor.root_urn) else _urn_name(parent)})
    return sorted(resources, key=lambda r: (r["name"], r["type"]))


def write(result: Result, out: Path) -> list[Path]:
    """Write resources.json, outputs.json and user-data/<name>.yaml under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "resources.json", out / "outputs.json"]
    written[0].write_text(json.dumps(result.resources, indent=2, sort_keys=True) + "\n")
    written[1].write_text(json.dumps(result.outputs, indent=2, sort_keys=True) + "\n")
    ud = out / "user-data"
    ud.mkdir(exist_ok=True)
    for name, text in sorted(result.user_data.items()):
        p = ud / f"{name}.yaml"
        p.write_text(text)
        written.append(p)
    return written
