"""The placement controller's serverless resources: made at home only for two or more placements, told
every placement's group through TRAINSTACK_PLACEMENTS, scheduled, least-privileged, and packaged so
that the handler the function names imports from what the package holds.

The stacks run the real `__main__.py` under the mocks (`ops synth`). The packaging test builds the
function's package from a stand-in `controller/handler.py` (the real one is the controller's own,
tested in tests/controller/) and imports the handler from the package alone, in a fresh interpreter.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pulumi
import pytest

from components import function_package, placement, pricing, project
from components.settings import load_settings
from controller.config import ENV_VAR as CONFIG_ENV
from ops import synth
from runfolder import layout
from tests.components.test_placements import HOME_GROUP, RAW, REGIONS

FUNCTION = {"aws": "aws:lambda/function:Function", "gcp": "gcp:cloudfunctionsv2/function:Function"}
SCHEDULE = {"aws": "aws:scheduler/schedule:Schedule", "gcp": "gcp:cloudscheduler/job:Job"}


@cache
def synthesized(cloud: str) -> synth.Result:
    return synth.synthesize(RAW[cloud], stack="places")


def _controller(r: synth.Result) -> list[dict]:
    return [x for x in r.resources if x["parent"] == "trainstack-controller"]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_function_is_told_every_placements_group_and_runs_on_a_schedule(cloud):
    r = synthesized(cloud)
    (fn,) = r.of_type(FUNCTION[cloud])
    env = fn["inputs"]["environment"]["variables"] if cloud == "aws" else \
        fn["inputs"]["serviceConfig"]["environmentVariables"]
    config = json.loads(env[CONFIG_ENV])
    s = load_settings(RAW[cloud], stack="places")
    assert config == placement.controller_config(s, r.outputs["runUri"], placement.group_names(s, HOME_GROUP))
    assert [p["group"] for p in config["placements"]] == [HOME_GROUP, f"{HOME_GROUP}-p1", f"{HOME_GROUP}-p2"]
    assert [p["region"] for p in config["placements"]] == REGIONS[cloud]
    assert config["wait_minutes"] == s.placement.wait_minutes and config["nodes"] == 1
    assert config["max_runtime_s"] == int(s.compute.max_runtime_hours * 3600)  # as the machines count it
    # The same document is the stack's `placements` output, where `ops move --stack` and `ops status` read it.
    from components.project import PLACEMENTS_OUTPUT

    assert json.loads(r.outputs[PLACEMENTS_OUTPUT]) == config
    (schedule,) = [x for x in r.of_type(SCHEDULE[cloud]) if x["parent"] == "trainstack-controller"]
    if cloud == "aws":
        assert (fn["inputs"]["runtime"], fn["inputs"]["handler"]) == ("python3.12", "controller.handler.handler")
        assert schedule["inputs"]["scheduleExpression"] == "rate(1 minute)"
        assert schedule["inputs"]["target"]["arn"].endswith(f":function:{fn['inputs']['name']}")
        files = fn["inputs"]["code"]["assetArchive"]
        assert "runfolder/layout.py" in files and "runfolder/lease.py" in files
        libraries = placement.library_files(federation=False)  # every placement on AWS
        assert not [name for name in files if name.startswith("trainer/")]  # the trainer stays on the machines
        assert "tenacity/retry.py" in libraries
        assert all(name in libraries or name.startswith(("controller/", "runfolder/")) and name.endswith(".py")
                   for name in files if name != function_package.DECISION_FILE)  # and the price decision's inputs
        assert set(libraries) <= set(files)
    else:
        build = fn["inputs"]["buildConfig"]
        assert (build["runtime"], build["entryPoint"]) == ("python312", "handler")
        assert schedule["inputs"]["schedule"] == "*/1 * * * *"
        assert schedule["inputs"]["httpTarget"]["uri"].endswith(".a.run.app")
        assert schedule["inputs"]["httpTarget"]["oidcToken"]["audience"] == schedule["inputs"]["httpTarget"]["uri"]
        assert fn["inputs"]["location"] == REGIONS[cloud][0]
    # Everything of the controller is made at home, through the home provider (but the wait for IAM to
    # propagate, which is the program's own: components/propagation.py).
    home = "trainstack-aws" if cloud == "aws" else "trainstack-gcp"
    made = [x for x in _controller(r) if x["type"] not in ("random:index/randomId:RandomId",
                                                           "pulumi-python:dynamic:Resource")]
    assert len(made) >= 8 and {x["options"]["provider"] for x in made} == {home}


def _package(r: synth.Result, cloud: str) -> dict:
    if cloud == "aws":
        (fn,) = r.of_type(FUNCTION["aws"])
        return fn["inputs"]["code"]["assetArchive"]
    (source,) = [x for x in r.of_type("gcp:storage/bucketObject:BucketObject") if x["name"].endswith("-source")]
    return source["inputs"]["source"]["assetArchive"]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_price_decisions_inputs_travel_in_the_functions_package(cloud):
    from controller import choice
    from controller.config import parse

    r = synthesized(cloud)
    s = load_settings(RAW[cloud], stack="places")
    files = _package(r, cloud)
    assert f"controller/{choice.INPUTS_FILE.name}" == function_package.DECISION_FILE  # where the handler reads it
    text = files[function_package.DECISION_FILE]["stringAsset"]
    assert text == pricing.decision_json(s)
    doc = json.loads(text)
    assert (doc["policy"], doc["rebalance"], doc["move_floor_usd"], doc["move_fraction"]) == ("cheapest", False, 1.0, 0.1)
    assert doc["steps"] == s.run.steps and doc["checkpoint_every_s"] == s.run.checkpoint_every_seconds
    assert [row["instance_types"] for row in doc["placements"]] == [
        list(p.instance_types) for p in s.placement_list]
    # The controller reads it back for the configuration the function's environment holds.
    (fn,) = r.of_type(FUNCTION[cloud])
    env = fn["inputs"]["environment"]["variables"] if cloud == "aws" else \
        fn["inputs"]["serviceConfig"]["environmentVariables"]
    inputs = choice.parse_inputs(doc, parse(env[CONFIG_ENV]))
    assert inputs.cheapest and len(inputs.placements) == 3
    assert not any("estimate_per_hour" in v or "instance_types" in v for v in env.values())  # not in the environment


def test_every_aws_function_of_the_stacks_fits_lambdas_environment_with_its_inputs_in_the_package():
    from components.aws import controller

    seen = []
    for path in sorted(synth.STACKS_DIR.glob("Pulumi.*.yaml")):
        name = path.name.split(".")[1]
        raw = synth.load_source(path, name)
        r = synth.synthesize(raw, stack=name)
        for fn in r.of_type(FUNCTION["aws"]):
            variables = fn["inputs"]["environment"]["variables"]
            assert set(variables) == {CONFIG_ENV}
            assert controller.environment_bytes(variables) <= controller.ENVIRONMENT_MAX_BYTES
            assert function_package.DECISION_FILE in fn["inputs"]["code"]["assetArchive"]
            seen.append(name)
    assert seen == ["regions"]  # the stacks' only AWS home with placements


# What only a package reaching a GCP group needs: google-auth and its transport, and the compiled
# libraries its credentials load, built for Lambda's Python.
FEDERATION_FILES = {"google/auth/aws.py", "requests/sessions.py", "certifi/cacert.pem", "cryptography/__init__.py",
                    "_cffi_backend.cpython-312-x86_64-linux-gnu.so"}
FEDERATION_TOPS = ("google/", "requests/", "certifi/", "pyasn1", "cryptography/", "cffi/", "_cffi_backend", "pycparser/",
                   "idna/", "charset_normalizer/")


@pytest.mark.parametrize("gcp_placement", [False, True])
def test_the_aws_package_carries_google_auth_only_when_a_placement_is_on_gcp(gcp_placement):
    from tests.components.test_cross_cloud_placements import synthesized as cross_cloud

    r = cross_cloud() if gcp_placement else synthesized("aws")
    (fn,) = r.of_type(FUNCTION["aws"])
    files = set(fn["inputs"]["code"]["assetArchive"])
    assert "tenacity/retry.py" in files and "controller/clouds.py" in files
    if gcp_placement:
        assert files >= FEDERATION_FILES
    else:
        assert [name for name in files if name.startswith(FEDERATION_TOPS)] == []


def test_the_gcp_function_installs_boto3_only_for_a_placement_on_aws():
    from components.gcp import controller

    r = synthesized("gcp")
    (source,) = [x for x in r.of_type("gcp:storage/bucketObject:BucketObject") if x["name"].endswith("-source")]
    lines = source["inputs"]["source"]["assetArchive"]["requirements.txt"]["stringAsset"].splitlines()
    # A stack of GCP placements: the GCS client and what a tick imports, nothing for AWS.
    assert lines == controller.requirements(federation=False) == [controller.GCS_REQUIREMENT, "tenacity==9.2.1",
                                                           "google-auth==2.63.0"]
    assert controller.requirements(federation=True) == [*lines, "boto3==1.44.8"]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_one_placement_has_no_controller(cloud):
    raw = {k: v for k, v in RAW[cloud].items() if k not in ("placements", "placement")}
    raw["compute"] = {"instanceTypes": RAW[cloud]["placements"][0]["instanceTypes"]}
    r = synth.synthesize(raw, stack="places")
    assert r.of_type(FUNCTION[cloud]) == [] and _controller(r) == []
    assert "placements" not in r.outputs and "runUri" in r.outputs
    assert r.of_type(f"trainstack:{cloud}:PlacementController") == []
    assert len(r.of_type(SCHEDULE[cloud])) == (1 if cloud == "gcp" else 0)  # GCP's runtime cap is a job too


def _policy(r: synth.Result, name: str) -> dict:
    return json.loads(r.named(name)["inputs"]["policy"])


# What the controller writes in the run folder: its record and events, the deadline (when no machine wrote
# it first), TIMED_OUT (a run past its deadline that no machine ended) and CANCELLED (a stop no trainer heeds); the price cache.
WRITTEN = (layout.PLACEMENT_KEY, layout.PLACEMENT_EVENTS_KEY, layout.DEADLINE_KEY, layout.TIMED_OUT, layout.CANCELLED,
           layout.PRICES_KEY)


def test_the_aws_function_reads_the_run_writes_only_its_record_and_sizes_only_these_groups_up_to_nodes():
    r = synthesized("aws")
    bucket = r.outputs["bucketName"]
    statements = {s["Sid"]: s for s in _policy(r, "trainstack-controller-policy")["Statement"]}
    assert statements["ReadRunFolder"]["Resource"] == f"arn:aws:s3:::{bucket}/runs/exp-7/*"
    assert statements["ListRunFolder"]["Condition"] == {"StringLike": {"s3:prefix": ["runs/exp-7/", "runs/exp-7/*"]}}
    assert statements["WritePlacement"]["Resource"] == [
        f"arn:aws:s3:::{bucket}/runs/exp-7/{key}" for key in WRITTEN] + [f"arn:aws:s3:::{bucket}/runs/exp-7/decisions/*"]
    assert statements["SizeGroups"]["Resource"] == [
        f"arn:aws:autoscaling:{region}:{synth.FAKE_ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/"
        f"{placement.group_name(HOME_GROUP, i)}" for i, region in enumerate(REGIONS["aws"])]
    assert statements["SizeGroups"]["Condition"] == {
        "NumericLessThanEquals": {"autoscaling:MinSize": "1", "autoscaling:MaxSize": "1"}}
    assert statements["ReadGroups"]["Action"] == ["autoscaling:DescribeAutoScalingGroups",
                                                   "autoscaling:DescribeScalingActivities"]
    # Nothing else: no delete, no other bucket, no write outside the record.
    actions = {a for s in statements.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions == {"s3:ListBucket", "s3:GetObject", "s3:PutObject", "autoscaling:DescribeAutoScalingGroups",
                       "autoscaling:DescribeScalingActivities", "autoscaling:UpdateAutoScalingGroup",
                       "ec2:DescribeSpotPriceHistory", "ec2:GetSpotPlacementScores"}
    assert statements["ReadSpotPrices"]["Resource"] == "*"  # neither price call has resource-level permissions
    (logs,) = _policy(r, "trainstack-controller-logging")["Statement"]
    assert logs["Resource"].endswith(f":log-group:/aws/lambda/{HOME_GROUP}-controller:*")
    (invoke,) = _policy(r, "trainstack-controller-scheduler-policy")["Statement"]
    assert invoke["Action"] == "lambda:InvokeFunction" and invoke["Resource"].endswith(f"{HOME_GROUP}-controller")
    trust = json.loads(r.named("trainstack-controller-scheduler-role")["inputs"]["assumeRolePolicy"])
    assert trust["Statement"][0]["Condition"] == {"StringEquals": {"aws:SourceAccount": synth.FAKE_ACCOUNT}}


def test_the_aws_function_policy_is_the_controllers_own_when_both_are_here():
    """Where the controller's own policy (controller/grants.py) is in the tree, the stack grants exactly it."""
    policy = pytest.importorskip("controller.grants")
    r = synthesized("aws")
    mine = _policy(r, "trainstack-controller-policy")
    theirs = policy.aws_policy(bucket=r.outputs["bucketName"], run_id="exp-7", nodes=1, account_id=synth.FAKE_ACCOUNT,
                               groups=[(region, placement.group_name(HOME_GROUP, i))
                                       for i, region in enumerate(REGIONS["aws"])])
    assert mine == theirs


def test_the_gcp_function_reads_the_run_writes_only_its_record_and_resizes_only_these_groups():
    r = synthesized("gcp")
    bucket = r.outputs["bucketName"]
    read, write = r.named("trainstack-controller-run-read"), r.named("trainstack-controller-placement-write")
    assert read["inputs"]["role"] == "roles/storage.objectViewer"
    assert read["inputs"]["condition"]["expression"].endswith(f'startsWith("projects/_/buckets/{bucket}/objects/runs/exp-7/")')
    assert write["inputs"]["condition"]["expression"] == " || ".join(
        f'resource.name == "projects/_/buckets/{bucket}/objects/runs/exp-7/{key}"'
        for key in WRITTEN) + f' || resource.name.startsWith("projects/_/buckets/{bucket}/objects/runs/exp-7/decisions/")'
    groups = r.named("trainstack-controller-groups")
    assert groups["inputs"]["condition"]["expression"] == " || ".join(
        f'resource.name == "projects/my-proj-123/regions/{region}/instanceGroupManagers/'
        f'{placement.group_name(HOME_GROUP, i)}"' for i, region in enumerate(REGIONS["gcp"]))
    role = r.named("trainstack-controller-groups-role")
    assert role["inputs"]["permissions"] == ["compute.instanceGroupManagers.get", "compute.instanceGroupManagers.list",
                                             "compute.instanceGroupManagers.update"]
    invoke = r.named("trainstack-controller-invoke")
    assert invoke["inputs"]["role"] == "roles/run.invoker" and invoke["inputs"]["member"].startswith("serviceAccount:ti-")
    (fn,) = r.of_type(FUNCTION["gcp"])
    assert fn["inputs"]["serviceConfig"]["serviceAccountEmail"].startswith("tc-")
    # The function's APIs are turned on for this stack only (a one-placement stack's APIs stay as they were).
    apis = {x["inputs"]["service"] for x in r.of_type("gcp:projects/service:Service")}
    assert {"cloudfunctions.googleapis.com", "cloudbuild.googleapis.com", "run.googleapis.com",
            "cloudbilling.googleapis.com"} <= apis


STAND_IN = '''"""A stand-in controller: answers with its configuration."""
import json
import os


def handler(event=None, context=None):
    return {"placements": len(json.loads(os.environ["TRAINSTACK_PLACEMENTS"])["placements"]),
            "layout": __import__("runfolder.layout", fromlist=["x"]).PLACEMENT_KEY}
'''


def _materialize(archive: pulumi.AssetArchive, into: Path) -> None:
    """Lay an archive out as the cloud unpacks it: each asset at its name, each folder archive under its name."""
    for name, asset in archive.assets.items():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(asset, pulumi.FileAsset):
            shutil.copyfile(asset.path, into / name)
        elif isinstance(asset, pulumi.StringAsset):
            (into / name).write_text(asset.text)
        else:
            raise AssertionError(f"{name}: {type(asset).__name__} is not packaged here")


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_package_holds_what_the_handler_imports(cloud, tmp_path, monkeypatch):
    root = tmp_path / "project"
    (root / "controller").mkdir(parents=True)
    (root / "controller" / "__init__.py").write_text("")
    (root / "controller" / "handler.py").write_text(STAND_IN)
    # Compiled files differ from machine to machine: never part of the package (the function would change).
    (root / "controller" / "__pycache__").mkdir()
    (root / "controller" / "__pycache__" / "handler.cpython-311.pyc").write_bytes(b"\0")
    shutil.copytree(project.RUNFOLDER_DIR, root / "runfolder", ignore=shutil.ignore_patterns("__pycache__"))
    # The trainer beside them is not the controller's: the package leaves it out.
    shutil.copytree(project.TRAINER_DIR, root / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(project, "ROOT", root)
    if cloud == "aws":
        from components.aws import controller
        archive, module, function = controller.function_code(), *controller.HANDLER.rsplit(".", 1)
    else:
        from components.gcp import controller
        archive, module, function = controller.function_source(), "main", controller.ENTRY_POINT
        assert archive.assets["requirements.txt"].text.splitlines() == [
            controller.GCS_REQUIREMENT, *placement.library_pins()] and placement.library_pins() == ["tenacity==9.2.1", "google-auth==2.63.0"]
    assert {"controller/__init__.py", "controller/handler.py", "runfolder/layout.py"} <= set(archive.assets)
    assert not [name for name in archive.assets if name.startswith("trainer/")]
    assert not [name for name in archive.assets if "__pycache__" in name or name.endswith(".pyc")]
    task = tmp_path / "task"
    task.mkdir()
    _materialize(archive, task)
    config = json.dumps({"placements": [{}, {}, {}]})
    code = f"import importlib, json; print(json.dumps(getattr(importlib.import_module({module!r}), {function!r})({{}}, None)))"
    # -I: the package alone (no project folder, no user site); the folder is the runtime's working directory.
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, '.'); {code}"], cwd=task,
                          env={"TRAINSTACK_PLACEMENTS": config}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"placements": 3, "layout": layout.PLACEMENT_KEY}


# What Lambda's Python runtime brings besides the standard library: boto3 and its own dependencies.
LAMBDA_RUNTIME = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six")


def test_the_real_package_runs_a_tick_in_lambdas_runtime(tmp_path, s3_run):
    # The package as `pulumi up` ships it, with the real controller, run where only Lambda's
    # runtime is importable (python -S: no site-packages): a tick of a finished run puts every
    # placement's group to zero on the emulated Auto Scaling.
    import boto3

    from components.aws import controller
    from devtools.sandbox import make_group
    from runfolder.storage import open_store
    from tests.userdata.helpers import group_size

    task, runtime = tmp_path / "task", tmp_path / "runtime"
    task.mkdir()
    runtime.mkdir()
    _materialize(controller.function_code(), task)
    site = Path(boto3.__file__).parents[1]
    for name in LAMBDA_RUNTIME:
        found = [p for p in (site / name, site / f"{name}.py") if p.exists()]
        (runtime / found[0].name).symlink_to(found[0])
    home = make_group(s3_run, 1)
    other = make_group(s3_run, 1)
    open_store(s3_run.uri).put_bytes(layout.COMPLETE, b'{"step": 10}')
    config = {"run_uri": s3_run.uri, "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": "us-east-1", "project": None, "group": home},
        {"cloud": "aws", "region": "us-east-1", "project": None, "group": other}]}
    env = {**s3_run.vars, CONFIG_ENV: json.dumps(config)}
    code = (f"import sys; sys.path[:0] = ['.', {str(runtime)!r}]; import json; "
            f"from controller.handler import handler; handler(); "
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('tenacity', 'google', 'tensorflow'))))")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=task, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer, imported = proc.stdout.splitlines()[-2:]
    assert json.loads(answer)["action"] == "finish"
    assert "tenacity" in json.loads(imported) and not [m for m in json.loads(imported) if m != "tenacity" and
                                                       not m.startswith("tenacity.")]
    assert group_size(s3_run, home) == (0, 0, 0) and group_size(s3_run, other) == (0, 0, 0)


def test_aws_ticks_are_delivered_with_no_retry_and_no_reservation_unless_asked():
    """Lambda retries an asynchronous invocation twice and keeps it six hours unless told; the scheduler retries
    185 times. Here neither retries and an event older than a minute is dropped. No concurrency is reserved by
    default (Lambda refuses any reservation on an account limited to 10): ticks side by side are safe by
    placement.json's conditional writes; `placement.reserveConcurrency` reserves one."""
    from components.aws import controller
    from tests.components import provider_values as pv

    r = synthesized("aws")
    (fn,) = r.of_type(FUNCTION["aws"])
    assert fn["inputs"]["reservedConcurrentExecutions"] == controller.UNRESERVED == -1
    reserved = synth.synthesize({**RAW["aws"], "placement": {"reserveConcurrency": True}}, stack="places")
    (one,) = reserved.of_type(FUNCTION["aws"])
    assert one["inputs"]["reservedConcurrentExecutions"] == 1
    (delivery,) = r.of_type("aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig")
    assert delivery["inputs"]["functionName"] == fn["inputs"]["name"]
    assert delivery["inputs"]["maximumRetryAttempts"] == 0
    assert 60 <= delivery["inputs"]["maximumEventAgeInSeconds"] <= 120
    (schedule,) = r.of_type(SCHEDULE["aws"])
    assert schedule["inputs"]["target"]["retryPolicy"] == {"maximumRetryAttempts": 0, "maximumEventAgeInSeconds": 60}
    # Each value is inside pulumi_aws's documented range; one outside it is caught.
    for rec in (fn, one, delivery, schedule):
        assert pv.check_resource(rec) == []
    for rec, key, bad in ((delivery, "maximumEventAgeInSeconds", 30), (delivery, "maximumRetryAttempts", 3)):
        planted = {**rec, "inputs": {**rec["inputs"], key: bad}}
        (problem,) = pv.check_resource(planted)
        assert (problem.path, problem.value) == (key, bad)


def test_gcp_ticks_run_one_instance_at_a_time_with_no_scheduler_retry():
    r = synthesized("gcp")
    (fn,) = r.of_type(FUNCTION["gcp"])
    assert fn["inputs"]["serviceConfig"]["maxInstanceCount"] == 1
    assert fn["inputs"]["serviceConfig"]["minInstanceCount"] == 0
    (job,) = [x for x in r.of_type(SCHEDULE["gcp"]) if x["parent"] == "trainstack-controller"]
    assert job["inputs"]["retryConfig"] == {"retryCount": 0}


# The worst case of the AWS function's environment: the most placements the settings take, every one but home on
# GCP (each with its `access`), the longest region names, project ids (30), stack (Pulumi's 100), run id (63),
# bucket name (63) and Pulumi project name the naming keeps (40 characters of it).
GCP_REGIONS = ["northamerica-northeast1", "northamerica-northeast2", "australia-southeast1", "australia-southeast2",
               "europe-southwest1", "southamerica-east1", "southamerica-west1", "europe-central2"]


def _longest_aws_home() -> dict:
    from components.settings.schema import Settings

    most = next(m.max_length for m in Settings.model_fields["placements"].metadata if hasattr(m, "max_length"))
    return {
        "cloud": "aws", "region": "ap-southeast-1", "run": {"synthetic": True, "steps": 100, "id": "r" * 63},
        "storage": {"bucketName": "b" * 63},
        "placements": [{"cloud": "aws", "region": "ap-southeast-1", "instanceTypes": ["g5.xlarge"]}] + [
            {"cloud": "gcp", "region": GCP_REGIONS[i], "project": f"p{i}" + "x" * 28, "instanceTypes": ["g2-standard-4"]}
            for i in range(most - 1)],
    }, most


def test_the_aws_functions_environment_fits_lambdas_limit_in_the_worst_case(monkeypatch):
    import re

    from components.aws import controller
    from ops import mockrun

    raw, most = _longest_aws_home()
    monkeypatch.setattr(mockrun, "project_name", lambda: "q" * 40)
    r = synth.synthesize(raw, stack="s" * 100)
    (fn,) = r.of_type(FUNCTION["aws"])
    variables = fn["inputs"]["environment"]["variables"]
    config = json.loads(variables[CONFIG_ENV])
    assert len(config["placements"]) == most == 8 and sum("access" in p for p in config["placements"]) == most - 1
    # GCP project numbers are at most 19 digits (int64); the fake cloud's are 12.
    longest = {k: re.sub(r"/projects/\d+/", "/projects/" + "9" * 19 + "/", v) for k, v in variables.items()}
    size = controller.environment_bytes(longest)
    assert 3000 < size <= controller.ENVIRONMENT_MAX_BYTES, size
    ((name, printed),) = synth.function_environments(r)
    assert name == fn["name"] and printed == controller.environment_bytes(variables)


def test_an_environment_lambda_would_refuse_is_refused_naming_the_key(monkeypatch):
    from components.aws import controller

    raw, _ = _longest_aws_home()
    monkeypatch.setattr(controller, "ENVIRONMENT_MAX_BYTES", 3000)
    with pytest.raises(synth.ProgramError, match=r"trainstack:placements: the placement controller's configuration "
                                                 r"takes \d+ bytes of Lambda's 3000"):
        synth.synthesize(raw, stack="s" * 100)


def test_the_gcp_function_is_built_by_its_own_account_with_the_documented_roles_narrowed():
    """Not the Compute Engine default account (roleless in new organisations): an account of the function's
    own, with Logs Writer, Artifact Registry Writer on the stack's own build repository only (the function's
    `docker_repository`: never Cloud Functions' `gcf-artifacts`), and read on the function's source object
    only, and on the sources Cloud Functions stages."""
    from components.gcp import controller as gcp_controller
    from policy import rules

    r = synthesized("gcp")
    bucket = r.outputs["bucketName"]
    (fn,) = r.of_type(FUNCTION["gcp"])
    build = r.named("trainstack-controller-build")
    assert build["inputs"]["accountId"].startswith("tb-") and 6 <= len(build["inputs"]["accountId"]) <= 30
    email = f"{build['inputs']['accountId']}@my-proj-123.iam.gserviceaccount.com"
    assert fn["inputs"]["buildConfig"]["serviceAccount"] == f"projects/my-proj-123/serviceAccounts/{email}"
    # The image goes to a repository the stack owns, in the function's project and region, in the form Cloud
    # Functions takes (projects/P/locations/R/repositories/ID), a Docker repository (the only format it takes).
    repo = r.named("trainstack-controller-build-repo")
    assert repo["type"] == "gcp:artifactregistry/repository:Repository" and repo["inputs"]["format"] == "DOCKER"
    assert repo["inputs"]["location"] == fn["inputs"]["location"] == "us-central1"
    assert repo["inputs"]["repositoryId"] == fn["inputs"]["name"]
    assert fn["inputs"]["buildConfig"]["dockerRepository"] == (
        f"projects/my-proj-123/locations/us-central1/repositories/{repo['inputs']['repositoryId']}")
    assert "dockerConfig" not in repo["inputs"]  # tags stay mutable: each build moves the function's tag
    member = f"serviceAccount:{email}"
    grants = {x["name"]: x["inputs"] for x in r.resources if x["inputs"].get("member") == member}
    image = grants.pop("trainstack-controller-build-image")
    assert r.named("trainstack-controller-build-image")["type"] == \
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"
    assert (image["role"], image["project"], image["location"], image["repository"], image.get("condition")) == (
        "roles/artifactregistry.writer", "my-proj-123", "us-central1", repo["inputs"]["repositoryId"], None)
    assert "trainstack-controller-build-repo" in r.named("trainstack-controller-build-image")["options"]["dependsOn"]
    assert not any("gcf-artifacts" in json.dumps(x["inputs"]) for x in r.resources)
    assert {n: (g["role"], (g.get("condition") or {}).get("expression")) for n, g in grants.items()} == {
        "trainstack-controller-build-logs": ("roles/logging.logWriter", None),
        "trainstack-controller-build-source": (
            "roles/storage.objectViewer",
            f'resource.name == "projects/_/buckets/{bucket}/objects/{gcp_controller.SOURCE_OBJECT}"'),
        "trainstack-controller-build-staged-source": (
            "roles/storage.objectViewer", 'resource.name.startsWith("projects/_/buckets/gcf-v2-sources-")'),
    }
    # The source object the grant names is the one the function is built from.
    (source,) = [x for x in r.of_type("gcp:storage/bucketObject:BucketObject") if x["name"] == "trainstack-controller-source"]
    assert source["inputs"]["name"] == gcp_controller.SOURCE_OBJECT == fn["inputs"]["buildConfig"]["source"][
        "storageSource"]["object"]
    # The function waits for the build grants to propagate (tests/components/test_propagation.py), and for its own
    # account's grants; the policy pack's least-privilege rule holds, and sees an admin role.
    wait = r.named("trainstack-controller-build-wait")
    assert set(wait["options"]["dependsOn"]) == {*grants, "trainstack-controller-build-image"}
    assert {"trainstack-controller-build-wait", "trainstack-controller-run-read"} <= set(fn["options"]["dependsOn"])
    assert rules.identity.iam_least_privilege(r.resources, None) == []
    planted = [{**x, "inputs": {**x["inputs"], "role": "roles/storage.admin", "condition": None}}
               if x["name"] == "trainstack-controller-build-staged-source" else x for x in r.resources]
    (violation,) = rules.identity.iam_least_privilege(planted, None)
    assert violation.resource == "trainstack-controller-build-staged-source"
