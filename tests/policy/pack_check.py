"""Drives the policy pack inside its own virtualenv (.venv-policy); tests/policy/test_pack.py runs it.

Reads {"stack", "config", "cases": {name: {"config", "resources"}}, "process_resources"} as JSON
on stdin (each case's config is the stack's `trainstack:` config the engine would pass), and writes JSON:
the pack's policies, the violations each case gets through the pack's resource and stack
policies (called as the engine calls them, with props behind pulumi-policy's proxies), and
what the pack reports over gRPC when started the way the engine starts it.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _opts(r: dict):
    from pulumi_policy.policy import PolicyCustomTimeouts, PolicyResourceOptions

    o = r.get("options") or {}
    return PolicyResourceOptions(bool(o.get("protect")), list(o.get("ignoreChanges") or []), None, [],
                                 PolicyCustomTimeouts(0, 0, 0), [], f"urn:pulumi:s::p::t::{r['parent']}" if r.get("parent") else None)


def _urn(r: dict) -> str:
    return f"urn:pulumi:s::trainstack::{r['type']}::{r['name']}"


def run_pack_functions(pack: dict, resources: list[dict]) -> list[list[str]]:
    """Every violation (policy, resource urn or '', message) the pack's policies report."""
    from pulumi_policy import ResourceValidationArgs, StackValidationArgs
    from pulumi_policy.policy import PolicyResource
    from pulumi_policy.proxy import unknown_checking_proxy

    found: list[list[str]] = []
    # The engine shows the pack every resource, components and providers included.
    custom = resources
    for policy in pack["POLICIES"]:
        def report(message, urn=None, _p=policy.name):
            found.append([_p, urn or "", message])

        if type(policy).__name__ == "ResourceValidationPolicy":
            for r in custom:
                args = ResourceValidationArgs(r["type"], unknown_checking_proxy(r["inputs"]), _urn(r), r["name"],
                                              _opts(r), None)
                urn = _urn(r)
                policy.validate(args, lambda m, _urn_arg=None, _u=urn, _p=policy.name: found.append([_p, _u, m]))
        else:
            by_name = {}
            prs = []
            for r in custom:
                pr = PolicyResource(r["type"], unknown_checking_proxy(r["inputs"]), _urn(r), r["name"], _opts(r),
                                    None, None, [], {})
                by_name[r["name"]] = pr
                prs.append((pr, r.get("parent")))
            for pr, parent in prs:
                pr.parent = by_name.get(parent) if parent else None
            policy.validate(StackValidationArgs([p for p, _ in prs]), report)
    return found


def run_pack_process(stack: str, resources: list[dict]) -> dict:
    """Start the pack the way the engine does and ask it, over gRPC, for its info and a verdict."""
    import grpc
    from google.protobuf import empty_pb2, struct_pb2
    from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

    env = dict(os.environ, PULUMI_STACK=stack, PULUMI_PROJECT="trainstack", PULUMI_DRY_RUN="true")
    proc = subprocess.Popen([sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", str(ROOT / "policy")],
                            cwd=ROOT / "policy", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the pack printed {port!r}, not its port; stderr: {proc.stderr.read()[-2000:]}")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = analyzer_pb2_grpc.AnalyzerStub(channel)
        info = stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
        verdicts = {}
        for r in resources:
            props = struct_pb2.Struct()
            props.update(r["inputs"])
            resp = stub.Analyze(analyzer_pb2.AnalyzeRequest(type=r["type"], properties=props, urn=_urn(r), name=r["name"],
                                                            options=analyzer_pb2.AnalyzerResourceOptions()), timeout=30)
            verdicts[r["name"]] = [[d.policyName, d.message] for d in resp.diagnostics]
        channel.close()
        return {"name": info.name, "policies": sorted(p.name for p in info.policies), "verdicts": verdicts}
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _with_config(config: dict, stack: str, fn):
    """Run fn with the SDK's config set to this stack's config, as the engine's PULUMI_CONFIG sets it."""
    from pulumi.runtime.config import set_all_config

    set_all_config({f"trainstack:{k}": json.dumps(v) for k, v in config.items()}, [])
    os.environ["PULUMI_STACK"] = stack
    return fn()


def main() -> None:
    req = json.load(sys.stdin)
    # What the engine hands every plugin: the stack's config as JSON, and the stack name.
    os.environ["PULUMI_CONFIG"] = json.dumps({f"trainstack:{k}": json.dumps(v) for k, v in req["config"].items()})
    os.environ["PULUMI_STACK"] = req["stack"]
    sys.path.insert(0, str(ROOT))
    started = time.time()
    pack = runpy.run_path(str(ROOT / "policy" / "__main__.py"), run_name="trainstack_policy_pack")
    import pulumi.runtime

    for k, v in pulumi.runtime.get_config_env().items():
        pulumi.runtime.set_config(k, v)
    out = {
        "policies": [[p.name, type(p).__name__] for p in pack["POLICIES"]],
        "cases": {name: _with_config(case["config"], case.get("stack", req["stack"]),
                                     lambda c=case: run_pack_functions(pack, c["resources"]))
                  for name, case in req["cases"].items()},
        "process": run_pack_process(req["stack"], req["process_resources"]),
        "seconds": round(time.time() - started, 2),
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
