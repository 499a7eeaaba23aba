"""`ops preflight`'s own part: how the checks are run, named and printed, for each placement.

`tests/ops/test_preflight.py` asks moto and a fake GCP API what each check finds; here the
per-cloud checks are replaced by recorders, so what `ops/preflight/__init__.py` and
`common.py` add is compared whole: which cloud, region and project each placement is checked
in (home's bucket and data only at home), the prefix a placement's problem gets, a check that
cannot run, each line printed and the exit status.
"""

from __future__ import annotations

import pytest

from components.project import STACKS_DIR
from ops import preflight
from ops.__main__ import OpsParser, main
from ops.preflight.common import Problem, run_checks


def test_a_problem_is_one_line_with_its_fix():
    assert Problem("the vCPU quota is 0", "ask for 8").line() == "the vCPU quota is 0; fix: ask for 8"


def test_each_check_runs_and_one_that_cannot_is_a_problem_naming_it():
    ran = []

    def ok(name, found):
        def check():
            ran.append(name)
            return found
        return check

    def broken():
        ran.append("broken")
        raise PermissionError("AccessDenied")

    problems = run_checks([("quota", ok("quota", [Problem("a", "x")])), ("zones", broken),
                           ("image", ok("image", [Problem("b", "y"), Problem("c", "z")]))],
                          lambda e: f"{type(e).__name__}: {e}")
    assert ran == ["quota", "broken", "image"]
    assert problems == [Problem("a", "x"),
                        Problem("could not check zones: PermissionError: AccessDenied",
                                "check the credentials (and their region/project) and run preflight again"),
                        Problem("b", "y"), Problem("c", "z")]
    assert run_checks([], str) == []


@pytest.fixture
def checks(monkeypatch):
    """The per-cloud checks, recording (cloud, region, project, home, session or api) and finding one problem each."""
    seen = []

    def aws(settings, session=None, *, home=True):
        seen.append(("aws", settings.region, home, session))
        return [Problem(f"aws {settings.region}", "fix aws")]

    def gcp(settings, api=None, *, home=True):
        seen.append(("gcp", settings.region, settings.project, home, api))
        return [Problem(f"gcp {settings.region}", "fix gcp")]

    monkeypatch.setattr(preflight, "check_aws", aws)
    monkeypatch.setattr(preflight, "check_gcp", gcp)
    return seen


def _settings(stack: str):
    from ops import synth

    return synth.load_source(STACKS_DIR / f"Pulumi.{stack}.yaml").settings


def test_each_placement_is_checked_in_its_cloud_and_region_and_named_in_its_problems(checks):
    session, api = object(), object()
    problems = preflight.check(_settings("gcp-aws"), aws_session=session, gcp_api=api)
    settings = _settings("gcp-aws")
    assert checks == [("gcp", "us-central1", settings.project, True, api), ("aws", "us-east-1", False, session)]
    assert problems == [Problem("gcp us-central1", "fix gcp"),
                        Problem("placements[1] (aws us-east-1): aws us-east-1", "fix aws")]


def test_a_stack_of_one_cloud_checks_home_then_each_other_region(checks):
    problems = preflight.check(_settings("regions"))
    assert checks == [("aws", "us-east-1", True, None), ("aws", "us-west-2", False, None)]
    assert [p.line() for p in problems] == ["aws us-east-1; fix: fix aws",
                                            "placements[1] (aws us-west-2): aws us-west-2; fix: fix aws"]


def test_preflight_prints_each_problem_then_a_summary_and_exits_1(checks, capsys):
    assert main(["preflight", "--stack", "regions"]) == 1
    assert capsys.readouterr() == (
        "aws us-east-1; fix: fix aws\n"
        "placements[1] (aws us-west-2): aws us-west-2; fix: fix aws\n"
        "preflight regions: 2 problem(s); `pulumi up` would not start a machine as asked\n", "")


def test_a_clean_stack_says_ok_with_its_cloud_and_region(monkeypatch, capsys):
    monkeypatch.setattr(preflight, "check_gcp", lambda settings, api=None, *, home=True: [])
    monkeypatch.setattr(preflight, "check_aws", lambda settings, session=None, *, home=True: [])
    assert main(["preflight", "--stack", "gcp-dev"]) == 0
    assert capsys.readouterr() == ("preflight gcp-dev: ok (gcp, us-central1)\n", "")


def test_the_session_and_api_reach_the_checks(checks, capsys):
    import argparse

    session, api = object(), object()
    args = argparse.Namespace(stack="gcp-aws", stacks_dir=str(STACKS_DIR))
    assert preflight.cmd_preflight(args, aws_session=session, gcp_api=api) == 1
    assert [c[-1] for c in checks] == [api, session]


def test_no_stack_file_is_one_line_naming_it(checks, tmp_path, capsys):
    assert main(["preflight", "--stack", "nope", "--stacks-dir", str(tmp_path)]) == 2
    assert capsys.readouterr() == ("", f"ops preflight: no stack file {tmp_path / 'Pulumi.nope.yaml'}\n")
    (tmp_path / "Pulumi.dir.yaml").mkdir()
    assert main(["preflight", "--stack", "dir", "--stacks-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"ops preflight: no stack file {tmp_path / 'Pulumi.dir.yaml'}\n"
    assert checks == []


def test_a_bad_stack_is_its_config_line_and_nothing_is_checked(checks, tmp_path, capsys):
    (tmp_path / "Pulumi.bad.yaml").write_text("config:\n  trainstack:cloud: aws\n  trainstack:regoin: x\n")
    assert main(["preflight", "--stack", "bad", "--stacks-dir", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "trainstack:" in err
    assert checks == []


def test_the_stack_is_read_under_its_own_name(checks, tmp_path, capsys):
    (tmp_path / "Pulumi.mine.yaml").write_text((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    assert main(["preflight", "--stack", "mine", "--stacks-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("preflight mine: 1 problem(s)")


def test_preflight_arguments(capsys, monkeypatch):
    parser = OpsParser(prog="python -m ops")
    preflight.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["preflight", "--stack", "dev"])
    assert (args.func, args.stacks_dir) == (preflight.cmd_preflight, str(STACKS_DIR))
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        parser.parse_args(["preflight", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--stack STACK stack name: stacks/Pulumi.<NAME>.yaml" in text
    assert f"--stacks-dir STACKS_DIR folder of the stack files (default: {STACKS_DIR})" in text
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert " check quotas, zones, image, bucket (AWS) or GPU quota, APIs (GCP) first " in " ".join(capsys.readouterr().out.split()) + " "
    with pytest.raises(SystemExit):
        parser.parse_args(["preflight"])
    assert "the following arguments are required: --stack" in capsys.readouterr().err


def test_a_second_gcp_placement_is_checked_without_homes_data(checks):
    from ops import synth

    raw = {"cloud": "gcp", "region": "us-central1", "project": "my-project-123", "run": {"synthetic": True},
           "placements": [{"cloud": "gcp", "region": r, "project": "my-project-123",
                           "instanceTypes": ["g2-standard-4"]} for r in ("us-central1", "us-east4")]}
    preflight.check(synth.load_source(raw, "two").settings)
    assert [(c[0], c[1], c[3]) for c in checks] == [("gcp", "us-central1", True), ("gcp", "us-east4", False)]


# -- GCP's problems, each line whole -------------------------------------------------------------


def _gcp():
    from tests.ops.test_preflight import GCP_OK, FakeGcp

    return FakeGcp(**GCP_OK)


def _gcp_settings(**blocks):
    from tests.ops.test_preflight import GCP, settings_of

    return settings_of(GCP, **blocks)


def test_gcp_apis_off_are_named_with_the_command_that_turns_them_on():
    from components.gcp.naming import PREREQUISITE_APIS
    from ops.preflight import gcp

    [p] = gcp.gcp_api_problems(_gcp_settings(), set())
    missing = list(PREREQUISITE_APIS)
    assert len(missing) >= 2 and p.line() == (
        f"API(s) {', '.join(missing)} off in project my-project; the stack cannot turn on the others without them; "
        f"fix: gcloud services enable {' '.join(missing)} --project my-project")
    assert gcp.compute_api_problem(_gcp_settings()).line() == (
        "the Compute Engine API (compute.googleapis.com) is off in project my-project, so its GPU quotas and machine "
        "types cannot be checked (`pulumi up` would turn it on, but a new project's GPU quota is 0 until you ask); "
        "fix: gcloud services enable compute.googleapis.com --project my-project, then run preflight again")


def test_a_gcp_read_refused_because_another_api_is_off_names_that_api():
    from ops.preflight import gcp
    from ops.preflight.gcp_api import ApiDisabled

    class Off(type(_gcp())):
        def routes(self, project):
            raise ApiDisabled("dns.googleapis.com", "SERVICE_DISABLED")

    problems = gcp.check_gcp(_gcp_settings(), _off(Off))
    assert [p.line() for p in problems] == [
        "the API dns.googleapis.com is off in project my-project (dns.googleapis.com is off: SERVICE_DISABLED); "
        "fix: gcloud services enable dns.googleapis.com --project my-project, then run preflight again"]


def _off(cls):
    """An instance of a FakeGcp subclass with every quota and API in order."""
    from tests.ops.test_preflight import GCP_OK

    return cls(**GCP_OK)


@pytest.mark.parametrize(("networks", "routes", "line"), [
    ({}, None,
     "project my-project has no VPC network named 'default', which the machines and their firewall rules use "
     "(organizations often skip it: compute.skipDefaultNetworkCreation); fix: gcloud compute networks create default "
     "--subnet-mode=auto --project my-project"),
    ({"default": {"name": "default"}}, None,
     "network default of project my-project has no subnet in us-central1, so no machine can start there; fix: gcloud "
     "compute networks subnets create default-us-central1 --network default --region us-central1 --range "
     "10.128.0.0/20 --project my-project (a range free in the network)"),
    (None, [{"destRange": "0.0.0.0/0"}],
     "network default of project my-project has no 0.0.0.0/0 route for the machines: they could not reach the "
     "bucket, the registry or the package index, and every boot would wait out its bounds until the runtime cap; "
     "fix: gcloud compute routes create default-internet --network default --destination-range 0.0.0.0/0 "
     "--next-hop-gateway default-internet-gateway --project my-project"),
])
def test_each_gcp_network_problem_is_one_whole_line(networks, routes, line):
    from ops.preflight import gcp

    api = _gcp()
    if networks is not None:
        api.networks = networks
    if routes is not None:
        api.route_list = routes
    assert [p.line() for p in gcp.gcp_network_problems(_gcp_settings(), api)] == [line]


def test_a_public_data_bucket_is_asked_about_its_prefix_and_home_checks_data_by_default():
    from ops.preflight import gcp
    from tests.ops.test_preflight import DataBuckets

    api = DataBuckets({"public-data": (set(), True)})
    s = _gcp_settings(run={"synthetic": False, "dataUri": "gs://public-data/lm/", "dataGrant": True})
    problems = gcp.check_gcp(s, api)
    assert "public public-data lm/" in api.calls
    assert [p.fix for p in problems] == ["set run.dataGrant: false"]


def test_each_gcp_check_that_cannot_run_is_named():
    from ops.preflight import gcp
    from tests.ops.test_preflight import DataBuckets

    class Broken(DataBuckets):
        def region_quotas(self, project, region):
            raise RuntimeError("quotas down")

        def region_zones(self, project, region):
            raise RuntimeError("zones down")

        def network(self, project, name):
            raise RuntimeError("network down")

        def bucket_permissions(self, bucket, permissions):
            raise RuntimeError("storage down")

    s = _gcp_settings(run={"synthetic": False, "dataUri": "gs://data-bucket/lm/"}, compute={"zones": []})
    assert [p.what for p in gcp.check_gcp(s, Broken({}))] == [
        "could not check GPU quota: RuntimeError: quotas down", "could not check machine types: RuntimeError: zones down",
        "could not check network: RuntimeError: network down", "could not check data bucket: RuntimeError: storage down"]


def test_gcp_quotas_missing_from_the_answer_count_as_zero(monkeypatch):
    from ops.preflight import gcp

    api = _gcp()
    api.region, api.project = {}, {}
    lines = [p.line() for p in gcp.gcp_quota_problems(_gcp_settings(), api)]
    assert lines == [
        "GPU quota NVIDIA_L4_GPUS in us-central1 is 0 (Spot VMs use it while PREEMPTIBLE_NVIDIA_L4_GPUS is 0); the "
        "stack needs 1 (1 per node x 1 node(s)), so no machine would start; fix: request 1 in the console (IAM & Admin "
        "> Quotas, metric compute.googleapis.com/nvidia_l4_gpus, region us-central1)",
        "GPU quota GPUS_ALL_REGIONS of project my-project is 0; the stack needs 1; fix: request 1 'GPUs (all regions)' "
        "in IAM & Admin > Quotas (new projects start at 0)"]


def test_an_n1_machines_gpu_quota_is_its_accelerators_and_an_unknown_family_has_none():
    from ops.preflight import gcp

    assert gcp.gcp_gpu_metric("e2-standard-4", None) is None
    api = _gcp()
    api.region = {"NVIDIA_T4_GPUS": (0, 0)}
    s = _gcp_settings(compute={"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4", "spot": False})
    assert [p.what.split(";")[0] for p in gcp.gcp_quota_problems(s, api)] == ["GPU quota NVIDIA_T4_GPUS in us-central1 "
                                                                              "is 0"]


def test_the_zones_are_asked_of_the_stacks_project_when_none_are_set():
    from ops.preflight import gcp

    api = _gcp()
    assert gcp.gcp_zones(_gcp_settings(compute={"zones": []}), api) == ["us-central1-a", "us-central1-b"]
    assert api.calls == ["zones my-project us-central1"]


@pytest.mark.parametrize(("quota", "lines"), [
    ((4, 3), []),  # one free: exactly what the stack needs
    ((4, 4), ["GPU quota GPUS_ALL_REGIONS of project my-project is 4 with 4 in use; the stack needs 1; fix: request 5 "
              "'GPUs (all regions)' in IAM & Admin > Quotas (new projects start at 0)"]),
])
def test_gpus_in_use_elsewhere_count_against_the_projects_quota(quota, lines):
    from ops.preflight import gcp

    api = _gcp()
    api.project = {"GPUS_ALL_REGIONS": quota}
    assert [p.line() for p in gcp.gcp_quota_problems(_gcp_settings(), api)] == lines
