"""Offline synth: a stack file, validated once, run through the Pulumi program under the SDK's mocks.

`synthesize()` reads a stack file from `stacks/` (or raw settings), validates it
(`components.settings`, one-line `ConfigError`), and runs `__main__.py` with that config
under the mock runtime (`ops.mockrun`) against a fake cloud (`ops.fakes`: lookups such as
the AMI, default VPC, subnets, account, zones and the GCE image answer with clearly fake,
well-formed values). `write()` puts what was registered on disk: `resources.json`,
`outputs.json` and `user-data/<resource>.yaml`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components import settings as config
from components.project import PLACEMENTS_OUTPUT, PROGRAM, ROOT, STACKS_DIR
from ops.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from ops.fakes.aws import FAKE_ACCOUNT, FAKE_AMI, FAKE_VPC, LAUNCH_TEMPLATE
from ops.fakes.common import DOCKER_IMAGE
from ops.fakes.gcp import FAKE_GCP_IMAGE, INSTANCE_TEMPLATE
from ops.mockrun import ProgramError, Result, project_name, run_program

__all__ = [
    "DOCKER_IMAGE", "FAKE_ACCOUNT", "FAKE_AMI", "FAKE_GCP_IMAGE", "FAKE_VPC", "INSTANCE_TEMPLATE", "LAUNCH_TEMPLATE",
    "PROGRAM", "ROOT", "STACKS_DIR", "ProgramError", "Result", "Source", "cmd_synth", "config_for_sdk", "load_source",
    "federated_subjects", "function_environments", "image_lines", "plan", "project_name", "subject_problem", "register", "run_program", "stack_names", "synthesize", "write",
]


@dataclass(frozen=True)
class Source:
    """A stack's config read and validated once: the settings and the stack file's whole config mapping."""

    settings: config.Settings
    """The validated `trainstack:` settings."""
    full_config: dict[str, Any]
    """Every key of the file's `config:` (other namespaces too), as the SDK will be given them."""


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


def load_source(source: str | Path | Mapping[str, Any] | Source, stack: str | None = None) -> Source:
    """The validated settings and full config of a stack file or raw settings, parsed once.

    `source` is a path to `Pulumi.<stack>.yaml`, a mapping of un-namespaced trainstack
    keys (cloud, region, run, ...), or an already loaded `Source` (returned as is).
    Raises `ConfigError` (one line naming the key).
    """
    if isinstance(source, Source):
        return source
    if isinstance(source, Mapping):
        raw = dict(source)
        full = {f"{config.NAMESPACE}:{k}": v for k, v in raw.items()}
        return Source(config.load_settings(raw, stack=stack or "test"), full)
    full = config.read_stack_file(source)
    settings = config.load_settings(config.raw_from_config(full), stack=stack or config.stack_name_of(source))
    return Source(settings, full)


def synthesize(source: str | Path | Mapping[str, Any] | Source, *, stack: str | None = None) -> Result:
    """Run the Pulumi program for a stack file (or raw settings, or a loaded `Source`) under mocks.

    Raises `ConfigError` before anything runs when the config is invalid.
    """
    loaded = load_source(source, stack)
    s = loaded.settings
    return run_program(config_for_sdk(loaded.full_config), stack=s.stack, region=s.region, gcp_project=s.project)


def plan(result: Result, settings: config.Settings, *, ask_prices: bool = True) -> str:
    """The readable plan for a synth result: resources by type, mock values marked, machines, cost and storage.

    With `ask_prices` and AWS credentials configured, spot prices come from EC2's price
    history; otherwise they are estimated (and say so).
    """
    from components import pricing, storage
    from ops import plan as plan_text

    spot_prices = None
    if ask_prices and settings.cloud == "aws" and settings.compute.spot:
        spot_prices = pricing.aws_spot_prices(settings.region, settings.compute.instance_types)
    est = pricing.hourly_cost(settings, spot_prices=spot_prices)
    checkpoints = storage.storage_plan(settings)
    placements: list[str] = []
    if len(settings.placement_list) > 1:
        from components import placement

        rows = pricing.placement_costs(settings, checkpoint_bytes=checkpoints.checkpoint_bytes)
        # The names the program gave (a GCP placement of an AWS home is named as GCE names groups).
        config = json.loads(result.outputs[PLACEMENTS_OUTPUT]) if result.outputs.get(PLACEMENTS_OUTPUT) else None
        groups = [p["group"] for p in config["placements"]] if config else \
            [placement.group_name(str(result.outputs.get("groupName", "")), i) for i in range(len(rows))]
        size = storage.size_text(checkpoints.checkpoint_bytes) + (" assumed" if checkpoints.size_assumed else "")
        placements = plan_text.placements_section(rows, groups, settings.placement.wait_minutes, size,
                                                  pricing.transfer_source())
        placements += plan_text.image_copies_lines(pricing.image_copies(settings), pricing.registry_source())
        placements += first_launch_lines(first_launch(settings, checkpoint_bytes=checkpoints.checkpoint_bytes))
    if settings.scheduler == "sagemaker":
        placements += sagemaker_lines(settings)
    if settings.scheduler == "vertex":
        placements += vertex_lines(settings)
    return plan_text.render(settings.stack, settings.cloud, settings.region, result.resources, result.outputs,
                            result.mock_values, est, settings.compute.gpus_per_node,
                            storage.plan_lines(checkpoints), placements)


def first_launch(settings: config.Settings, *, checkpoint_bytes: int, now: float | None = None) -> dict:
    """The decision table the placement controller's first launch would write (controller/table.py's document),
    every placement priced from the stack's price table (components/prices.yaml through
    ``pricing.decision_inputs``) as the controller prices a placement no cloud has answered for, and costed by
    ``controller.cost.estimate`` with nothing measured yet: a run that has not trained has no steps per hour of
    its own, so E stays unknown until it has."""
    import time

    from components import pricing
    from controller import cost, prices, table

    now = time.time() if now is None else now
    nodes = settings.compute.nodes
    inputs = pricing.decision_inputs(settings)
    places = settings.placement_list
    offers = [prices.offer(i, p.cloud, p.region, doc, nodes=nodes) for i, (p, doc) in enumerate(zip(places, inputs,
                                                                                                    strict=True))]
    quotes = prices.quotes_for({}, offers, now=now, estimates={i: doc["estimate_per_hour"] for i, doc in
                                                               enumerate(inputs)})
    run = cost.RunFacts(nodes=nodes, remaining_steps=settings.run.steps,
                        checkpoint_interval_s=float(settings.run.checkpoint_every_seconds or 0),
                        checkpoint_bytes=checkpoint_bytes, measured_rates={}, now=now,
                        deadline=now + settings.compute.max_runtime_hours * 3600)
    estimates = [cost.estimate(run, cost.PlacementFacts(
        index=i, price=q.price, gpu=doc["gpu"], boot_s=float(pricing.DECISION_BOOT_S[places[i].cloud]),
        restore_per_gb=doc["restore_per_gb"],
        writes_per_gb=doc["writes_per_gb"], max_price=doc["max_price_per_hour"]))
        for i, (q, doc) in enumerate(zip(quotes, inputs, strict=True))]
    policy = settings.placement.choose
    first = policy == table.CHEAPEST  # every group starts at 0: the first tick launches where the table says
    choice = table.choose(estimates, active=0, policy=policy, floor_usd=settings.placement.move_floor_usd,
                          fraction=settings.placement.move_fraction, first=first)
    labels = table.labels([(p.cloud, p.region, p.project or None) for p in places])
    boots = [(float(pricing.DECISION_BOOT_S[p.cloud]), "prior") for p in places]
    doc = table.document(table.rows(labels, quotes, estimates, now=now, boots=boots), choice, now=now,
                         active=None if first else 0, policy=policy)
    if first:
        doc["first_launch"] = True
    return doc


def first_launch_lines(doc: dict) -> list[str]:
    """The first launch's table as the plan prints it (``ops.why``'s words, as ``ops status`` shows a decision),
    marked as an estimate."""
    from ops import why

    rows = why.decision_lines(doc, estimate=True)
    lines = ["First launch: the table the placement controller would start from (an estimate: priced from the "
             "stack's price table, components/prices.yaml; running, it asks each cloud's price API)"]
    lines += [f"  {text}" for _label, text in rows]
    chosen = doc.get("chosen")
    if doc.get("first_launch"):
        lines.append(f"  Every group starts at 0; the controller's first tick (within a minute of `pulumi up`) launches "
                     f"the run in placement {chosen}, as priced then, and writes its table")
    else:
        lines.append("  `pulumi up` starts home's group (inOrder); the controller moves the run only when a placement "
                     "cannot launch")
    if all(r.get("cost") is None for r in doc.get("rows") or []):
        lines.append("  E (the expected cost to finish) is unknown until the run has measured its own steps per hour; "
                     "then every restart decides again by it (ops status shows each decision)")
    return lines


def sagemaker_lines(settings: config.Settings) -> list[str]:
    """A SageMaker stack's job, and what its price figures are: SageMaker publishes no spot price by API."""
    from schedulers import sagemaker

    c = settings.compute
    return [
        f"SageMaker: the run is one training job on {sagemaker.instance_type(c.instance_types[0])} x {c.nodes}"
        f"{', managed spot' if c.spot else ''}, waiting and training within {c.max_runtime_hours:g} h of its first "
        f"start; nothing runs until `python -m ops start --stack {settings.stack}` submits it",
        "  Price: an estimate. SageMaker publishes no spot price by API; AWS documents managed spot as up to 90 % off "
        "the ml.* on-demand price, which is above the EC2 figures shown for the same machine. The real cost is the "
        "job's billable seconds; ops status shows them and the saving, 1 - billable / training",
    ]


def vertex_lines(settings: config.Settings) -> list[str]:
    """A Vertex AI stack's job, and what its price figures are: Compute Engine's, below Vertex AI's own rates."""
    from components import catalog

    c = settings.compute
    kind, count = catalog.vertex_accelerator(c.instance_types[0], c.accelerator, c.gpus_per_node)
    gpus = f" with {count} x {kind}" if kind else ""
    return [
        f"Vertex AI: the run is one CustomJob on {c.instance_types[0]}{gpus} x {c.nodes}"
        f"{', Spot' if c.spot else ''}, within {c.max_runtime_hours:g} h of its first start (scheduling.timeout); "
        f"nothing runs until `python -m ops start --stack {settings.stack}` submits it",
        "  Price: an estimate. The figures above are Compute Engine's; Vertex AI bills custom training at its own "
        "rates per machine and GPU, above Compute Engine's for the same machine (Spot jobs at its Spot rates), and "
        "reports no billable seconds: the bill is the job's running time at those rates",
    ]


# A workload identity pool's provider: its attribute mapping gives each federated caller's `google.subject`.
POOL_PROVIDER = "gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider"


def image_lines(result: Result, settings: config.Settings) -> list[str]:
    """Where the digest every machine runs comes from: `image.digest`, or the registry at `pulumi up`
    (synth cannot ask it: the digest in what it wrote is a stand-in)."""
    image = settings.image
    if image.digest:
        lines = [f"image: {image.repository}@{image.digest} (image.digest)"]
    else:
        lines = [f"image: {repo}:{tag}: `pulumi up` resolves the tag to its digest at {url} and every machine "
                 f"runs that digest; synth used a stand-in (pin one with image.digest)"
                 for repo, tag, url in result.digest_lookups]
    if image.build:
        from datetime import date

        from components import findings

        scanner = {"aws": "ECR's scan", "gcp": "Artifact Analysis"}[settings.cloud]
        lines.append("image.build: the machines run the pushed image by its digest, built FROM the one above, once "
                     f"{scanner} of it has no finding at or above image.maxSeverity {image.max_severity} "
                     f"(waited for up to image.scanWaitMinutes {image.scan_wait_minutes} min; synth cannot see findings)")
        lines += signing_lines(result, settings)
        lines += findings.allowance_lines(image.allow_findings, date.today())
    return lines


# What signs a built image, by cloud: the key's resource type and what ImageSignature names it by.
SIGNING_KEYS = {"aws": ("aws:kms/key:Key", "AWS KMS key"), "gcp": ("gcp:kms/cryptoKey:CryptoKey", "Cloud KMS key")}


def signing_lines(result: Result, settings: config.Settings) -> list[str]:
    """Which key signs the built image, where the signature goes, and what the machines check before `docker run`."""
    typ, what = SIGNING_KEYS[settings.cloud]
    keys = [r["name"] for r in result.of_type(typ)]
    signatures = [r for r in result.resources if r["type"] == "pulumi-python:dynamic:Resource"
                  and {"key", "repository_urls", "digest"} <= set(r["inputs"])]
    if not keys or not signatures:
        return ["image.build: the pushed image is NOT signed: its machines verify no signature"]
    repos = sum(len(s["inputs"]["repository_urls"]) for s in signatures)
    return [f"image.build: then signed by the {what} {keys[0]} (ECDSA P-256; the deployer alone may sign) as cosign "
            f"does, at the digest's sha256-<hex>.sig tag in {repos} repositor{'y' if repos == 1 else 'ies'} "
            f"({', '.join(s['name'] for s in signatures)}); "
            + ("SageMaker runs the signed digest, and checks no signature itself" if settings.scheduler == "sagemaker"
               else "every machine checks the signature with the key's public half in its user data "
                    "(TRAINSTACK_IMAGE_PUBLIC_KEY) before `docker run`, and refuses an image that fails")]


def federated_subjects(result: Result) -> list[tuple[str, int]]:
    """(provider resource, bytes of the longest `google.subject` it maps) for every workload identity pool
    provider the program makes: the role its condition admits, in the longest partition, with a session name
    of IAM's longest. Google's STS refuses a subject over `SUBJECT_MAX_BYTES`."""
    from components.gcp.federation import LONGEST_NAME, subject_bytes_worst_case

    out = []
    for r in result.of_type(POOL_PROVIDER):
        admitted = re.search(r"assumed-role/([^\"/]+)\"", str(r["inputs"].get("attributeCondition") or ""))
        role = admitted.group(1) if admitted else "r" * LONGEST_NAME
        out.append((r["name"], subject_bytes_worst_case(role, r["inputs"]["attributeMapping"])))
    return out


LAMBDA_FUNCTION = "aws:lambda/function:Function"


def function_environments(result: Result) -> list[tuple[str, int]]:
    """(function resource, bytes its environment variables take) for every Lambda function the program makes:
    Lambda refuses more than `components.aws.controller.ENVIRONMENT_MAX_BYTES` together."""
    from components.aws.controller import environment_bytes

    return [(r["name"], environment_bytes((r["inputs"].get("environment") or {}).get("variables") or {}))
            for r in result.of_type(LAMBDA_FUNCTION)]


def subject_problem(subjects: list[tuple[str, int]]) -> str | None:
    """One line naming the first provider whose subject Google would refuse, or None."""
    from components.gcp.federation import SUBJECT_MAX_BYTES

    for name, size in subjects:
        if size > SUBJECT_MAX_BYTES:
            return (f"ops synth: {name} maps a federated google.subject of up to {size} bytes; Google's STS refuses "
                    f"over {SUBJECT_MAX_BYTES}: map it to something bounded (components/gcp/federation.py)")
    return None


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


def stack_names(stacks_dir: Path) -> list[str]:
    """The stacks there are: NAME for each stacks_dir/Pulumi.NAME.yaml."""
    return sorted(config.stack_name_of(p) for p in Path(stacks_dir).glob("Pulumi.*.yaml"))


def cmd_synth(args: argparse.Namespace) -> int:
    """`python -m ops synth`: exit 2 with one line on a bad or unknown stack, nothing written."""
    stack_file = Path(args.stacks_dir) / f"Pulumi.{args.stack}.yaml"
    if not stack_file.is_file():
        known = stack_names(Path(args.stacks_dir))
        there = f"stacks there: {', '.join(known)}" if known else "there is no stack file there"
        print(f"ops synth: no stack file {stack_file}; {there}", file=sys.stderr)
        return EXIT_ERROR
    try:
        # Parsed and validated once, before the program runs or DIR is touched: a bad stack writes nothing.
        source = load_source(stack_file, args.stack)
    except config.ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_ERROR
    try:
        result = synthesize(source)
    except ProgramError as e:
        # The program itself failed (not the config): one line, nothing written.
        print(f"ops synth: the program failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    subjects = federated_subjects(result)
    problem = subject_problem(subjects)
    if problem:
        print(problem, file=sys.stderr)
        return EXIT_ERROR
    out = Path(args.out)
    written = write(result, out)
    print(f"synth {args.stack}: {len(result.resources)} resources, {len(result.user_data)} user-data file(s) -> {out}")
    for p in written:
        print(f"  {p}")
    if subjects:
        from components.gcp.federation import SUBJECT_MAX_BYTES

        print("federated subjects (the longest a caller can present):")
        for name, size in subjects:
            print(f"  {name}: google.subject at most {size} of {SUBJECT_MAX_BYTES} bytes")
    environments = function_environments(result)
    if environments:
        from components.aws.controller import ENVIRONMENT_MAX_BYTES

        for name, size in environments:
            print(f"{name}: environment variables take {size} of Lambda's {ENVIRONMENT_MAX_BYTES} bytes")
    for line in image_lines(result, source.settings):
        print(line)
    print()
    print(plan(result, source.settings, ask_prices=not args.offline), end="")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `synth` command to `python -m ops`."""
    p = sub.add_parser("synth", help="run the Pulumi program offline under mocks and write what it would create")
    p.add_argument("--stack", required=True, help="stack name: stacks/Pulumi.<NAME>.yaml")
    p.add_argument("--out", required=True, help="folder for resources.json, outputs.json, user-data/")
    p.add_argument("--stacks-dir", default=str(STACKS_DIR), help="folder of the stack files (default: %(default)s)")
    p.add_argument("--offline", action="store_true",
                   help="never ask the cloud for spot prices, even with AWS credentials (the plan estimates them)")
    p.set_defaults(func=cmd_synth)
