"""The mock runner: `__main__.py` run by the Pulumi SDK's mock runtime, every registration recorded.

No cloud account, no credentials and no Pulumi CLI: the program runs exactly as `pulumi up`
would run it, against the fake cloud of `ops.fakes`, and every resource it registers is
recorded with its inputs (camelCase, as the engine sees them) and its resource options.

`run_program()` can run many times in one process: each run gets a fresh context for the
SDK's global state (settings, config, root stack), its own event loop and its own mock
monitor, and waits for every output before returning. The SDK's non-public calls this
needs are all in `install_mock_runtime`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import runpy
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_in_stack
from pulumi.runtime.sync_await import _ensure_event_loop

from components import registry, userdata
from components.project import PROGRAM, PULUMI_YAML, ROOT
from ops.fakes import Mocks, jsonable, urn_name
from ops.fakes.aws import LAUNCH_TEMPLATE
from ops.fakes.gcp import INSTANCE_TEMPLATE

log = logging.getLogger("ops.synth")


def project_name() -> str:
    """The project's name from Pulumi.yaml (what `pulumi.get_project()` returns)."""
    doc = yaml.safe_load(PULUMI_YAML.read_text()) or {}
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
    mock_values: set[str] = field(default_factory=set)
    """Ids and values the fake cloud made up (ARNs, AMI, subnets, account): never the user's real ones."""
    digest_lookups: list[tuple[str, str, str]] = field(default_factory=list)
    """(repository, tag, manifest URL) of each image tag `pulumi up` would resolve to its digest there
    (components/registry.py); synth put a stand-in digest in its place."""

    def of_type(self, type_token: str) -> list[dict[str, Any]]:
        """The resources of one type token, e.g. aws:s3/bucket:Bucket."""
        return [r for r in self.resources if r["type"] == type_token]

    def named(self, name: str) -> dict[str, Any]:
        """The one resource with this name."""
        found = [r for r in self.resources if r["name"] == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} resources named {name!r}")
        return found[0]


class _Monitor(pulumi_mocks.MockMonitor):
    """The SDK's mock monitor, also recording each registration's options.

    The mock runtime hands `Mocks.new_resource` only the inputs; options such as
    retainOnDelete and ignoreChanges travel in the same request, so they are read here.
    """

    def __init__(self, mocks: Mocks):
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
                "inputs": jsonable(inputs),
                "options": {
                    "retainOnDelete": bool(request.retainOnDelete),
                    # The `import_` option: the id of an existing resource the engine adopts instead of creating.
                    "importId": request.importId or None,
                    "protect": bool(request.protect),
                    "ignoreChanges": list(request.ignoreChanges),
                    "deleteBeforeReplace": bool(request.deleteBeforeReplace),
                    "replaceOnChanges": list(request.replaceOnChanges),
                    "provider": urn_name(request.provider) if request.provider else None,
                    "dependsOn": sorted(urn_name(d) for d in request.dependencies),
                    "custom": bool(request.custom),
                },
            }
        )
        return response


def install_mock_runtime(monitor: _Monitor, sdk_config: Mapping[str, str], *, project: str, stack: str) -> None:
    """Point the SDK at `monitor` with this config, as `pulumi.runtime.set_mocks` would, minus its root stack.

    Relies on pulumi 3.272.0 (requirements.txt) internals that `set_mocks` itself uses:
    `settings.reset_options`, `settings.configure`, `mocks.MockSettings` / `MockEngine`,
    `config.set_all_config`, and (in `_Monitor`) `rpc.deserialize_properties` and
    `sync_await._ensure_event_loop`; `run_program` then makes the root with
    `stack.run_in_stack`, as the Python language host does for `pulumi up`, so that every
    output is awaited. On a pulumi upgrade, check these first (tests/ops/test_ops_synth.py).
    """
    pulumi_settings.reset_options(project=project, stack=stack, preview=False)
    set_all_config(dict(sdk_config), [])
    pulumi_settings.configure(
        pulumi_mocks.MockSettings(
            monitor=monitor,
            monitor_features=set(monitor.GetDeploymentInfo(None).supportedFeatures),
            engine=pulumi_mocks.MockEngine(log),
            project=project,
            stack=stack,
            dry_run=False,
            organization="organization",
            root_directory=str(ROOT),
            callbacks=None,
        )
    )


def run_program(sdk_config: Mapping[str, str], *, stack: str, region: str, gcp_project: str = "") -> Result:
    """Run `__main__.py` with this SDK config as-is (no validation first) under mocks.

    `ops.synth.synthesize` is the usual entry; this one also shows what the program itself does
    with a config that is wrong. Fake lookups answer for `region`.
    """
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    # The SDK keeps its settings, config and root stack in context variables: a copied
    # context gives this run its own and leaves the caller's untouched.
    ctx = contextvars.copy_context()
    return ctx.run(_run, dict(sdk_config), stack, region, gcp_project)


def _run(sdk_config: dict[str, str], stack: str, region: str, gcp_project: str) -> Result:
    mocks = Mocks(region, gcp_project)
    monitor = _Monitor(mocks)
    # No registry is reached offline: a tag's digest is a stand-in, and the run records where it would come from.
    lookups = registry.use_synth_digests()
    install_mock_runtime(monitor, sdk_config, project=project_name(), stack=stack)
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
    return Result(resources=resources, outputs=jsonable(monitor.stack_outputs), user_data=user_data, invokes=mocks.invokes,
                  mock_values=set(mocks.made), digest_lookups=list(lookups))


def _resolve_parents(monitor: _Monitor) -> list[dict[str, Any]]:
    """The records with parents as names (None for top-level), sorted by name and type."""
    resources = []
    for r in monitor.records:
        parent = r["parent"]
        resources.append({**r, "parent": None if parent in (None, monitor.root_urn) else urn_name(parent)})
    return sorted(resources, key=lambda r: (r["name"], r["type"]))
