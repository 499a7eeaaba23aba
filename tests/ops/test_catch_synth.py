"""`ops synth` in this process with the Pulumi program replaced by a result given here.

`tests/ops/test_ops_synth.py` runs the real program under Pulumi's mock runtime (seconds a
stack, and it cannot run in the mutation run's forked workers); here `ops.mockrun.run_program`
is a recorder that returns a small `Result`, so what `ops synth` itself does is checked line
by line: the config the SDK gets, the refusals before anything is written, the files it
writes, the federated subjects and Lambda environments it measures, and the plan it ends with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from components import settings as config
from components.gcp.federation import SUBJECT_MAX_BYTES
from ops import synth
from ops.__main__ import main
from ops.mockrun import ProgramError, Result

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"google.subject": "assertion.arn"}


def _provider(name: str, role: str | None) -> dict:
    condition = f"assertion.arn.startsWith(\"arn:aws:sts::1:assumed-role/{role}\")" if role else None
    return {"type": synth.POOL_PROVIDER, "name": name, "parent": None,
            "inputs": {"attributeMapping": MAPPING, **({"attributeCondition": condition} if condition else {})}}


def _function(name: str, variables: dict | None) -> dict:
    inputs = {"environment": {"variables": variables}} if variables is not None else {}
    return {"type": synth.LAMBDA_FUNCTION, "name": name, "parent": None, "inputs": inputs}


def _result(resources=(), outputs=None, user_data=None) -> Result:
    bucket = {"type": "aws:s3/bucket:Bucket", "name": "trainstack-bucket", "parent": None,
              "inputs": {"bucket": "b"}}
    return Result(resources=[bucket, *resources], outputs=outputs or {"runUri": "s3://b/runs/dev"},
                  user_data=user_data if user_data is not None else {"lt-b": "#cloud-config\nb: 1\n",
                                                                     "lt-a": "#cloud-config\na: 1\n"},
                  mock_values={"ami-FAKE"})


@pytest.fixture
def program(monkeypatch):
    """`run_program` recording its arguments and returning `program.result` (or raising `program.error`)."""

    class Program:
        result = _result()
        error: Exception | None = None
        calls: list = []

    def run(cfg, **kw):
        Program.calls.append((cfg, kw))
        if Program.error:
            raise Program.error
        return Program.result

    monkeypatch.setattr(synth, "run_program", run)
    monkeypatch.setattr("components.pricing.aws_spot_prices", lambda *a, **k: pytest.fail("asked the cloud"))
    return Program


def test_the_stack_files_config_reaches_the_sdk_as_strings():
    assert synth.config_for_sdk({"a:n": 3, "a:on": True, "a:off": False, "a:s": "x", "a:o": {"k": [1]},
                                 "a:l": ["x", 2], "a:f": 1.5}) == {
        "a:n": "3", "a:on": "true", "a:off": "false", "a:s": "x", "a:o": '{"k": [1]}', "a:l": '["x", 2]', "a:f": "1.5"}


def test_a_stack_file_is_read_and_validated_once(program):
    source = synth.load_source(ROOT / "stacks" / "Pulumi.dev.yaml")
    assert source.settings.stack == "dev" and source.full_config["trainstack:cloud"] == "aws"
    assert synth.load_source(source) is source
    raw = synth.load_source({"cloud": "aws", "region": "us-east-1",
                             "compute": {"instanceTypes": ["g5.xlarge"]}, "run": {"synthetic": True}})
    assert raw.settings.stack == "test" and raw.full_config["trainstack:region"] == "us-east-1"
    assert synth.load_source(ROOT / "stacks" / "Pulumi.dev.yaml", "other").settings.stack == "other"


def test_synthesize_runs_the_program_with_the_stacks_config_region_and_project(program):
    synth.synthesize(ROOT / "stacks" / "Pulumi.gcp-dev.yaml")
    cfg, kw = program.calls[-1]
    settings = synth.load_source(ROOT / "stacks" / "Pulumi.gcp-dev.yaml").settings
    assert kw == {"stack": "gcp-dev", "region": settings.region, "gcp_project": settings.project}
    assert settings.project and cfg["trainstack:cloud"] == "gcp"
    assert json.loads(cfg["trainstack:compute"]) == yaml.safe_load(
        (ROOT / "stacks" / "Pulumi.gcp-dev.yaml").read_text())["config"]["trainstack:compute"]


def test_write_puts_resources_outputs_and_each_user_data_file(tmp_path):
    result = _result(outputs={"z": 1, "a": "x"})
    written = synth.write(result, tmp_path / "out" / "deep")
    out = tmp_path / "out" / "deep"
    assert written == [out / "resources.json", out / "outputs.json", out / "user-data" / "lt-a.yaml",
                       out / "user-data" / "lt-b.yaml"]
    assert (out / "outputs.json").read_text() == '{\n  "a": "x",\n  "z": 1\n}\n'
    assert json.loads((out / "resources.json").read_text()) == result.resources
    assert (out / "resources.json").read_text().endswith("}\n]\n")
    assert (out / "user-data" / "lt-b.yaml").read_text() == "#cloud-config\nb: 1\n"
    assert synth.write(result, out) == written  # a second write into the same folder


def test_the_stacks_there_are_named(tmp_path):
    for name in ("b", "a-b", "c"):
        (tmp_path / f"Pulumi.{name}.yaml").write_text("config: {}\n")
    (tmp_path / "Pulumi.yaml").write_text("name: x\n")
    assert synth.stack_names(tmp_path) == ["a-b", "b", "c"]


def test_each_federated_subject_is_measured_for_the_role_its_condition_admits():
    result = _result([_provider("pool-a", "trainstack-ctrl"), _provider("pool-b", None)])
    arn = "arn:aws-us-gov:sts::123456789012:assumed-role/{}/" + "s" * 64
    assert synth.federated_subjects(result) == [("pool-a", len(arn.format("trainstack-ctrl"))),
                                                ("pool-b", len(arn.format("r" * 64)))]


def test_a_subject_google_would_refuse_is_one_line_naming_the_provider():
    assert synth.subject_problem([("a", SUBJECT_MAX_BYTES)]) is None
    assert synth.subject_problem([]) is None
    assert synth.subject_problem([("a", 10), ("big", SUBJECT_MAX_BYTES + 1), ("bigger", 500)]) == (
        f"ops synth: big maps a federated google.subject of up to {SUBJECT_MAX_BYTES + 1} bytes; Google's STS refuses "
        f"over {SUBJECT_MAX_BYTES}: map it to something bounded (components/gcp/federation.py)")


def test_each_lambda_functions_environment_is_measured():
    result = _result([_function("ctrl", {"AB": "xyz", "C": "é"}), _function("bare", None)])
    assert synth.function_environments(result) == [("ctrl", 2 + 3 + 1 + 2), ("bare", 0)]


def _args(tmp_path: Path, stack: str = "dev", **kw) -> list[str]:
    argv = ["synth", "--stack", stack, "--out", str(tmp_path / "out")]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return argv


def test_synth_writes_the_files_and_ends_with_the_plan(program, tmp_path, capsys):
    program.result = _result([_provider("pool-a", "ctrl"), _function("ctrl-fn", {"K": "vv"})])
    assert main(_args(tmp_path, offline=True)) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    subject = synth.federated_subjects(program.result)[0][1]
    assert lines[:10] == [
        f"synth dev: 3 resources, 2 user-data file(s) -> {tmp_path / 'out'}",
        f"  {tmp_path / 'out' / 'resources.json'}", f"  {tmp_path / 'out' / 'outputs.json'}",
        f"  {tmp_path / 'out' / 'user-data' / 'lt-a.yaml'}", f"  {tmp_path / 'out' / 'user-data' / 'lt-b.yaml'}",
        "federated subjects (the longest a caller can present):",
        f"  pool-a: google.subject at most {subject} of {SUBJECT_MAX_BYTES} bytes",
        "ctrl-fn: environment variables take 3 of Lambda's 4096 bytes",
        "",
        "Plan for stack dev (aws, us-east-1); offline: values marked (mock) come from the fake cloud, not your account",
    ]
    assert "spot $0.4024/h (estimate)" in out and out.endswith("\n") and not out.endswith("\n\n")


def test_synth_without_subjects_or_functions_says_nothing_of_them(program, tmp_path, capsys):
    assert main(_args(tmp_path, offline=True)) == 0
    out = capsys.readouterr().out
    assert "federated subjects" not in out and "environment variables" not in out
    assert out.splitlines()[5] == ""


def test_synth_asks_the_cloud_for_spot_prices_unless_offline(program, tmp_path, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr("components.pricing.aws_spot_prices",
                        lambda region, types: asked.append((region, list(types))) or {"g5.xlarge": 0.25})
    assert main(_args(tmp_path)) == 0
    dev = synth.load_source(ROOT / "stacks" / "Pulumi.dev.yaml").settings
    assert asked == [("us-east-1", list(dev.compute.instance_types))] and "g5.xlarge" in asked[0][1]
    assert "spot $0.25/h (price API)" in capsys.readouterr().out


def test_an_unknown_stack_names_the_stacks_there(program, tmp_path, capsys):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    assert main(_args(tmp_path, "nope", stacks_dir=stacks)) == 2
    assert capsys.readouterr() == ("", f"ops synth: no stack file {stacks / 'Pulumi.nope.yaml'}; there is no stack "
                                       "file there\n")
    (stacks / "Pulumi.b.yaml").write_text("config: {}\n")
    (stacks / "Pulumi.a.yaml").write_text("config: {}\n")
    assert main(_args(tmp_path, "nope", stacks_dir=stacks)) == 2
    assert capsys.readouterr().err == f"ops synth: no stack file {stacks / 'Pulumi.nope.yaml'}; stacks there: a, b\n"
    assert program.calls == [] and not (tmp_path / "out").exists()


def test_a_stack_that_is_a_folder_is_no_stack_file(program, tmp_path, capsys):
    stacks = tmp_path / "stacks"
    (stacks / "Pulumi.dir.yaml").mkdir(parents=True)
    assert main(_args(tmp_path, "dir", stacks_dir=stacks)) == 2
    assert capsys.readouterr().err.startswith(f"ops synth: no stack file {stacks / 'Pulumi.dir.yaml'}; ")


def test_a_bad_stack_is_its_one_config_line_and_nothing_runs(program, tmp_path, capsys):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    doc["config"]["trainstack:regoin"] = "us-east-1"
    (stacks / "Pulumi.bad.yaml").write_text(yaml.safe_dump(doc))
    assert main(_args(tmp_path, "bad", stacks_dir=stacks)) == 2
    out, err = capsys.readouterr()
    with pytest.raises(config.ConfigError) as e:
        synth.load_source(stacks / "Pulumi.bad.yaml", "bad")
    assert (out, err) == ("", f"{e.value}\n") and err.startswith("trainstack:regoin")
    assert program.calls == [] and not (tmp_path / "out").exists()


def test_a_program_that_fails_is_exit_1_and_writes_nothing(program, tmp_path, capsys):
    program.error = ProgramError("the bucket component raised KeyError: 'x'", [])
    assert main(_args(tmp_path)) == 1
    assert capsys.readouterr() == ("", "ops synth: the program failed: the bucket component raised KeyError: 'x'\n")
    assert not (tmp_path / "out").exists()


def test_a_subject_too_long_for_google_is_refused_before_anything_is_written(program, tmp_path, capsys):
    program.result = _result([_provider("pool-a", None)])
    program.result.resources[1]["inputs"]["attributeMapping"] = {"google.subject": "assertion.arn + assertion.arn"}
    assert main(_args(tmp_path)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ops synth: pool-a maps a federated google.subject of up to ")
    assert not (tmp_path / "out").exists()


def test_the_plan_of_several_placements_names_each_group(program):
    source = synth.load_source(ROOT / "stacks" / "Pulumi.regions.yaml")
    by_name = synth.plan(_result(outputs={"groupName": "ts-g"}), source.settings, ask_prices=False)
    assert "  0 aws us-east-1 (home): group ts-g;" in by_name and "  1 aws us-west-2: group ts-g-p1;" in by_name
    doc = {"run_uri": "s3://b/runs/r", "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": "us-east-1", "group": "home-grp"},
        {"cloud": "aws", "region": "us-west-2", "group": "west-grp"}]}
    given = synth.plan(_result(outputs={"groupName": "ts-g", "placements": json.dumps(doc)}), source.settings,
                       ask_prices=False)
    assert "  0 aws us-east-1 (home): group home-grp;" in given and "  1 aws us-west-2: group west-grp;" in given
    one = synth.plan(_result(outputs={"groupName": "ts-g"}), synth.load_source(ROOT / "stacks" / "Pulumi.dev.yaml")
                     .settings, ask_prices=False)
    assert "Placements:" not in one


def test_synth_arguments(program, capsys, monkeypatch):
    from ops.__main__ import OpsParser

    parser = OpsParser(prog="python -m ops")
    synth.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["synth", "--stack", "dev", "--out", "o"])
    assert (args.func, args.stacks_dir, args.offline) == (synth.cmd_synth, str(synth.STACKS_DIR), False)
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        parser.parse_args(["synth", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for line in ["--stack STACK stack name: stacks/Pulumi.<NAME>.yaml",
                 "--out OUT folder for resources.json, outputs.json, user-data/",
                 f"--stacks-dir STACKS_DIR folder of the stack files (default: {synth.STACKS_DIR})",
                 "--offline never ask the cloud for spot prices, even with AWS credentials (the plan estimates them)"]:
        assert line in text, line
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert " run the Pulumi program offline under mocks and write what it would create " in " ".join(capsys.readouterr().out.split()) + " "
    for missing in (["synth", "--out", "o"], ["synth", "--stack", "dev"]):
        with pytest.raises(SystemExit):
            parser.parse_args(missing)
        assert "the following arguments are required" in capsys.readouterr().err


def test_synth_parses_nothing_it_does_not_know(program, tmp_path):
    with pytest.raises(SystemExit):
        main([*_args(tmp_path), "--regoin"])
    assert program.calls == []


def test_the_plan_of_several_placements_is_the_plan_texts_sections_in_order(program):
    from components import placement, pricing, storage
    from ops import plan as plan_text

    raw = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True}, "image": {"build": True, "keepImages": 4},
           "placement": {"waitMinutes": 25},
           "compute": {"gpusPerNode": 4, "instanceTypes": ["g5.12xlarge"]},
           "placements": [{"cloud": "aws", "region": r, "instanceTypes": ["g5.12xlarge"]}
                          for r in ("us-east-1", "us-west-2")]}
    settings = synth.load_source(raw, "img").settings
    result = _result(outputs={"groupName": "ts-g", "runUri": "s3://b/runs/img"})
    checkpoints = storage.storage_plan(settings)
    rows = pricing.placement_costs(settings, checkpoint_bytes=checkpoints.checkpoint_bytes)
    size = storage.size_text(checkpoints.checkpoint_bytes) + " assumed"
    assert checkpoints.size_assumed
    expected = plan_text.render(
        "img", "aws", "us-east-1", result.resources, result.outputs, result.mock_values,
        pricing.hourly_cost(settings), 4, storage.plan_lines(checkpoints),
        plan_text.placements_section(rows, [placement.group_name("ts-g", i) for i in range(2)], 25, size,
                                     pricing.transfer_source())
        + plan_text.image_copies_lines(pricing.image_copies(settings), pricing.registry_source())
        + synth.first_launch_lines(synth.first_launch(settings, checkpoint_bytes=checkpoints.checkpoint_bytes)))
    text = synth.plan(result, settings, ask_prices=False)
    assert text == expected
    for line in ["Machines: 1 node x 4 GPU, spot, one of: g5.12xlarge", "  ts-g", "waitMinutes (25)", f"({size})",
                 f"  Transfer prices: {pricing.transfer_source()}; not a quote.", "  Built image: stored in 2",
                 storage.plan_lines(checkpoints)[0]]:
        assert line in text, line


def test_the_plan_asks_the_cloud_for_spot_prices_by_default(program, monkeypatch):
    asked = []
    monkeypatch.setattr("components.pricing.aws_spot_prices", lambda region, types: asked.append(region) or {})
    synth.plan(_result(), synth.load_source(ROOT / "stacks" / "Pulumi.dev.yaml").settings)
    assert asked == ["us-east-1"]


def test_synthesize_names_raw_settings_by_the_stack_given(program):
    raw = {"cloud": "aws", "region": "us-east-1", "compute": {"instanceTypes": ["g5.xlarge"]}, "run": {"synthetic": True}}
    synth.synthesize(raw, stack="moves")
    assert program.calls[-1][1]["stack"] == "moves"
    synth.synthesize(raw)
    assert program.calls[-1][1]["stack"] == "test"


def test_resources_json_is_sorted_and_indented_for_diffs(tmp_path):
    result = _result()
    result.resources[0] = {"type": "t", "name": "n", "parent": None, "inputs": {"z": 1, "a": 2}}
    synth.write(result, tmp_path)
    assert (tmp_path / "resources.json").read_text() == (
        '[\n  {\n    "inputs": {\n      "a": 2,\n      "z": 1\n    },\n    "name": "n",\n    "parent": null,\n'
        '    "type": "t"\n  }\n]\n')


@pytest.mark.parametrize("stack", ["regions", "gcp-aws"])
def test_the_first_launch_table_is_priced_from_the_price_table_and_says_it_is_an_estimate(stack):
    from components import pricing, storage
    from controller import table

    settings = synth.load_source(ROOT / "stacks" / f"Pulumi.{stack}.yaml").settings
    inputs = pricing.decision_inputs(settings)
    doc = synth.first_launch(settings, checkpoint_bytes=storage.storage_plan(settings).checkpoint_bytes, now=1.8e9)
    # cheapest (the default): no placement is active before the first tick launches the run, and with no measured
    # rate it goes where a unit of GPU work costs least.
    least = min(range(len(inputs)), key=lambda i: (doc["rows"][i]["work_usd"], i))
    assert doc["policy"] == settings.placement.choose == "cheapest" and doc["active"] is None
    assert doc["chosen"] == least and all(r["work_usd"] > 0 for r in doc["rows"])
    assert doc["first_launch"] is True
    assert [(r["index"], r["price"], r["price_source"], r["price_age_s"]) for r in doc["rows"]] == [
        (i, d["estimate_per_hour"], "estimate", None) for i, d in enumerate(inputs)]
    assert [r["label"] for r in doc["rows"]] == [f"{p.cloud} {p.region}" for p in settings.placement_list]
    # Nothing measured yet: E is unknown, and every placement is feasible.
    assert all(r["cost"] is None and r["feasible"] and r["why"] == "rate unknown: no measured rate yet"
               for r in doc["rows"])
    assert set(doc) == set(table.document([], table.Choice(0, ""), now=0, active=0, policy="cheapest")) | {"first_launch"}
    lines = synth.first_launch_lines(doc)
    assert lines[0].startswith("First launch: the table the placement controller would start from (an estimate: "
                               "priced from the stack's price table, components/prices.yaml")
    assert lines[1] == (f"  estimate cheapest: placement {least} (the first launch: no measured rate yet, so no E; the "
                        "least price per unit of GPU work (machines, restores and checkpoint writes, times the overhead, "
                        "over the GPU's relative throughput))")
    assert len(lines) == 2 + len(inputs) + 2 and "E unknown" in lines[2] and "estimate" in lines[2]
    assert lines[-2] == ("  Every group starts at 0; the controller's first tick (within a minute of `pulumi up`) launches "
                         f"the run in placement {least}, as priced then, and writes its table")
    assert "unknown until the run has measured its own steps per hour" in lines[-1]


def test_with_in_order_the_first_launch_is_homes_started_by_pulumi_up():
    from components import storage

    settings = synth.load_source(ROOT / "stacks" / "Pulumi.regions.yaml").settings
    settings = settings.model_copy(update={"placement": settings.placement.model_copy(update={"choose": "inOrder"})})
    doc = synth.first_launch(settings, checkpoint_bytes=storage.storage_plan(settings).checkpoint_bytes, now=1.8e9)
    assert doc["active"] == 0 and "first_launch" not in doc
    assert synth.first_launch_lines(doc)[-2].startswith("  `pulumi up` starts home's group (inOrder)")


def test_a_first_launch_table_with_a_cost_has_no_note_on_unknown_costs():
    doc = {"policy": "cheapest", "chosen": 1, "active": 0, "reason": "r",
           "rows": [{"index": 0, "cost": 3.0}, {"index": 1, "cost": 2.0}]}
    assert [x for x in synth.first_launch_lines(doc) if "unknown until" in x] == []
