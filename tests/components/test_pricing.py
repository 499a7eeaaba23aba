"""The shipped price table and the cost arithmetic: every accepted type priced, machines x nodes, worst case."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components import catalog, pricing
from components.settings import load_settings, load_stack_file

ROOT = Path(__file__).resolve().parents[2]


def _settings(cloud="aws", region="us-east-1", **compute):
    raw = {"cloud": cloud, "region": region, "run": {"synthetic": True}, "compute": compute}
    if cloud == "gcp":
        raw["project"] = "my-project-123"
    return load_settings(raw, stack="t")


def _accepted(cloud: str) -> list[str]:
    table = catalog.AWS_GPU_INSTANCES if cloud == "aws" else catalog.GCP_GPU_MACHINES
    # With compute.imageId every type that TensorFlow can use is accepted.
    return [t for t in table if catalog.unsupported_reason(cloud, t, custom_image=True) is None]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_every_accepted_type_has_an_entry_in_every_recorded_region(cloud):
    table = pricing.price_table()
    assert table["recorded"] and table["source"] and table["currency"] == "USD"
    groups = table[cloud]
    assert groups
    for g in groups:
        listed = g["on_demand"]
        missing = [t for t in _accepted(cloud) if t not in listed]
        assert missing == [], f"{cloud} {g['regions']}: no entry for {missing}"
        priced = [t for t in _accepted(cloud) if listed[t] is not None]
        # An explicit null (no recorded price) is the exception, not the rule.
        assert len(priced) >= len(_accepted(cloud)) - 1
        assert all(0 < listed[t] < 200 for t in priced)
    if cloud == "gcp":
        accelerators = [a for a in catalog.GCP_N1_ACCELERATORS if catalog.unsupported_reason("gcp", a) is None]
        assert all(a in groups[0]["accelerators"] for a in accelerators)


@pytest.mark.parametrize("path", sorted((ROOT / "stacks").glob("Pulumi.*.yaml")), ids=lambda p: p.name)
def test_the_project_stacks_are_fully_priced(path):
    s = load_stack_file(path)
    est = pricing.hourly_cost(s)
    assert est.missing == []
    assert est.worst_total is not None and est.worst_total > 0


def test_spot_expected_and_worst_case_for_several_nodes():
    # Two sizes of one GPU model (A10G): a cluster takes one model.
    s = _settings(instanceTypes=["g5.2xlarge", "g5.xlarge"], nodes=3, maxRuntimeHours=10)
    est = pricing.hourly_cost(s)
    fraction = pricing.price_table()["spot_estimate_fraction"]
    assert est.spot and est.estimated
    assert est.hourly_low == pytest.approx(1.006 * fraction * 3)
    assert est.hourly_high == pytest.approx(1.212 * fraction * 3)
    # Spot never costs more than on-demand: the worst case is the dearest on-demand price.
    assert est.worst_hourly == pytest.approx(1.212 * 3)
    assert est.worst_total == pytest.approx(36.36)


def test_max_price_caps_the_worst_case():
    s = _settings(instanceTypes=["g5.xlarge"], nodes=2, maxPricePerHour=0.5, maxRuntimeHours=4)
    est = pricing.hourly_cost(s)
    assert est.worst_hourly == pytest.approx(1.0)
    assert est.worst_total == pytest.approx(4.0)


def test_on_demand_stack_is_priced_on_demand_and_not_an_estimate():
    s = _settings(instanceTypes=["g6.xlarge"], spot=False, nodes=2, maxRuntimeHours=1.5)
    est = pricing.hourly_cost(s)
    assert not est.estimated
    assert est.hourly_low == est.hourly_high == pytest.approx(0.8048 * 2)
    assert est.worst_total == pytest.approx(round(0.8048 * 2 * 1.5, 2))


def test_spot_prices_from_the_api_replace_the_estimate():
    s = _settings(instanceTypes=["g5.xlarge", "g6.xlarge"])
    est = pricing.hourly_cost(s, spot_prices={"g5.xlarge": 0.31, "g6.xlarge": 0.27})
    assert not est.estimated
    assert [t.spot_source for t in est.types] == ["api", "api"]
    assert (est.hourly_low, est.hourly_high) == (0.27, 0.31)
    partial = pricing.hourly_cost(s, spot_prices={"g5.xlarge": 0.31})
    assert partial.estimated and [t.spot_source for t in partial.types] == ["api", "estimate"]


def test_gcp_n1_is_priced_per_vcpu_plus_each_gpu():
    s = _settings("gcp", "us-central1", instanceTypes=["n1-standard-8"], accelerator="nvidia-tesla-t4", gpusPerNode=4,
                  spot=False)
    est = pricing.hourly_cost(s)
    assert est.hourly_low == pytest.approx(0.0475 * 8 + 0.35 * 4)


def test_a_region_without_recorded_prices_says_so_and_guesses_nothing():
    s = _settings(region="eu-west-1", instanceTypes=["g5.xlarge"])
    est = pricing.hourly_cost(s)
    assert est.missing == ["g5.xlarge"]
    assert est.hourly_low is None and est.worst_total is None


def test_aws_spot_prices_come_from_ec2_price_history():
    """Against moto's EC2 (every zone answers a fixed price): the mean over the region's zones."""
    from moto import mock_aws

    with mock_aws():
        prices = pricing.aws_spot_prices("us-east-1", ["g5.xlarge", "g4dn.xlarge"])
    assert prices is not None and set(prices) == {"g5.xlarge", "g4dn.xlarge"}
    assert all(p == pytest.approx(0.00001) for p in prices.values())


def test_aws_spot_prices_not_asked_without_credentials(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    asked = []
    monkeypatch.setattr("boto3.client", lambda *a, **k: asked.append(a))
    assert pricing.aws_spot_prices("us-east-1", ["g5.xlarge"]) is None
    assert asked == []


def test_aws_spot_prices_give_none_when_ec2_refuses():
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    with Stubber(client) as stub:
        stub.add_client_error("describe_spot_price_history", "UnauthorizedOperation", http_status_code=403)
        assert pricing.aws_spot_prices("us-east-1", ["g5.xlarge"], client=client) is None
        stub.assert_no_pending_responses()


@pytest.mark.parametrize(("compute", "price", "what"), [
    ({"instanceTypes": ["g5.xlarge", "g4dn.xlarge"]}, 1.006 * 0.4, "spot estimate (dearest type)"),
    ({"instanceTypes": ["g5.xlarge"], "maxPricePerHour": 0.3}, 0.3, "spot estimate (dearest type)"),
    ({"instanceTypes": ["g6.xlarge"], "spot": False}, 0.8048, "on-demand (dearest type)"),
])
def test_the_machines_get_a_price_per_machine_hour_that_the_trainer_records(compute, price, what):
    from components.userdata import boot_env
    from trainer.config import as_dict, load_config

    env = boot_env(_settings(**compute), run_uri="s3://b/runs/x", group="g", code_uri="")
    recorded = pricing.price_table()["recorded"]
    assert float(env["TRAINSTACK_PRICE_PER_HOUR"]) == pytest.approx(price, abs=1e-4)
    assert env["TRAINSTACK_PRICE_NOTE"] == f"{what}, price table {recorded}"
    # The trainer reads them from its environment (the container's env file) into its `started` config.
    cfg = as_dict(load_config([], {k: v for k, v in env.items() if k.startswith("TRAINSTACK_")}))
    assert cfg["price_per_hour"] == pytest.approx(price, abs=1e-4) and cfg["price_note"] == env["TRAINSTACK_PRICE_NOTE"]


def test_no_recorded_price_gives_the_machines_none():
    from components.userdata import boot_env

    env = boot_env(_settings(region="eu-west-1", instanceTypes=["g5.xlarge"]), run_uri="s3://b/runs/x", group="g",
                   code_uri="")
    assert "TRAINSTACK_PRICE_PER_HOUR" not in env and "TRAINSTACK_PRICE_NOTE" not in env and env["TRAINSTACK_STEPS"]


@pytest.mark.parametrize(("home", "cloud", "region", "per_gb", "kind"), [
    ("us-east-1", "aws", "us-east-1", 0.0, "same region"),
    ("us-east-1", "aws", "us-west-2", 0.02, "inter-region"),
    ("us-east-1", "gcp", "us-central1", 0.09, "internet"),
    ("us-central1", "gcp", "us-east1", 0.02, "same continent"),
    ("us-central1", "gcp", "northamerica-northeast1", 0.02, "same continent"),
    ("us-central1", "gcp", "europe-west4", 0.05, "inter-continent"),
    ("us-central1", "aws", "us-east-1", 0.12, "internet"),
])
def test_transfer_prices_between_placements(home, cloud, region, per_gb, kind):
    home_cloud = "aws" if home.count("-") == 2 else "gcp"
    t = pricing.transfer_per_gb(home_cloud, home, cloud, region)
    assert (t.per_gb, t.kind) == (per_gb, kind)
    # Each price is per the sending cloud's unit: AWS's GB (10^9 bytes), Google's GiB (2^30 bytes).
    assert (t.unit_bytes, t.unit) == ((10**9, "GB") if home_cloud == "aws" else (2**30, "GiB"))


@pytest.mark.parametrize(("sender", "home", "region", "per_unit", "unit_bytes"), [
    ("aws", "us-east-1", "us-west-2", 0.02, 10**9),
    ("gcp", "us-central1", "europe-west4", 0.05, 2**30),
    ("gcp", "us-central1", "us-east-1", 0.12, 2**30),
])
def test_a_transfer_costs_its_bytes_in_the_senders_billing_unit(sender, home, region, per_unit, unit_bytes):
    """Google's network prices are per GiB: 1 GiB from GCS costs exactly the listed price, where dividing by
    10^9 would overstate it by 7.4 %; AWS's are per GB."""
    t = pricing.transfer_per_gb(sender, home, "aws" if region.count("-") == 2 else "gcp", region)
    assert t.cost(unit_bytes) == pytest.approx(per_unit)
    restore = pricing.PlacementCost(1, "x", region, None, t, 2**30)
    assert restore.restore_cost == round(per_unit * 2**30 / unit_bytes, 4)
    if sender == "gcp":
        assert restore.restore_cost == per_unit


def test_synth_plan_shows_every_placements_prices_and_restore_transfer_with_the_tables_source():
    from ops import synth

    raw = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True},
           "placements": [{"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]},
                          {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g6.xlarge"]},
                          {"cloud": "aws", "region": "eu-central-1", "instanceTypes": ["g5.xlarge"]}]}
    text = synth.plan(synth.synthesize(raw, stack="moves"), synth.load_source(raw, "moves").settings, ask_prices=False)
    section = text.split("Placements: 3, home first", 1)[1].split("\nFirst launch", 1)[0].splitlines()[1:]
    assert "\nFirst launch: " in text.split("\nCheckpoint storage", 1)[0]  # the first launch's table follows
    assert len(section) == 4, section
    home, west, frankfurt, source = section
    g6 = pricing.on_demand_price("aws", "us-west-2", "g6.xlarge") * pricing.price_table()["spot_estimate_fraction"]
    assert home.startswith("  0 aws us-east-1 (home): group trainstack-moves-gpu;") and "own region" in home
    assert west.startswith("  1 aws us-west-2: group trainstack-moves-gpu-p1;") and f"${g6:g}/h spot estimate" in west
    # One checkpoint (the storage plan's assumed 1 GiB) read across regions at the recorded $/GB.
    assert f"inter-region at $0.02/GB: ${0.02 * 1024**3 / 1e9:.4f}" in west
    assert "no recorded price in eu-central-1" in frankfurt and "inter-region at $0.02/GB" in frankfurt
    assert source.startswith("  Transfer prices: recorded ") and "not checked live" in source
    assert pricing.transfer_source().startswith("recorded 2026-12-01")


@pytest.mark.parametrize("cloud, regions, free", [
    ("aws", ["us-east-1", "us-west-2", "eu-central-1"], 0.0),
    ("gcp", ["us-central1", "us-east4"], 0.5),
])
def test_a_built_image_in_every_placements_region_is_priced_per_copy_in_the_plan(cloud, regions, free):
    from ops import synth

    types = ["g5.xlarge"] if cloud == "aws" else ["g2-standard-4"]
    raw = {"cloud": cloud, "region": regions[0], "run": {"synthetic": True},
           "image": {"build": True, "keepImages": 4},
           "placements": [{"cloud": cloud, "region": r, "instanceTypes": types} for r in regions]}
    if cloud == "gcp":
        raw["project"] = "my-project-123"
        for p in raw["placements"]:
            p["project"] = "my-project-123"
    settings = synth.load_source(raw, "img").settings
    copies = pricing.image_copies(settings)
    assert (copies.copies, copies.per_gb_month, copies.free_gb_month, copies.keep_images) == (
        len(regions), 0.10, free, 4)
    assert copies.monthly_per_gb() == pytest.approx(0.10 * len(regions))
    text = synth.plan(synth.synthesize(raw, stack="img"), settings, ask_prices=False)
    (line,) = [x for x in text.splitlines() if x.startswith("  Built image:")]
    assert f"stored in {len(regions)} repositories" in line and "$0.1 per GB-month" in line
    assert f"${0.10 * len(regions):g} a month per GB of image in all" in line
    assert ("first 0.5 GB-month is free" in line) == bool(free)
    assert "up to 4 images (image.keepImages)" in line and pricing.registry_source() in line
    # It belongs to the placements' section, after the transfer prices' source.
    assert text.index("  Transfer prices:") < text.index("  Built image:")


@pytest.mark.parametrize("build, placements", [(False, 2), (True, 1)])
def test_no_image_copies_without_a_built_image_in_several_placements(build, placements):
    from ops import plan

    raw = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True}, "image": {"build": build},
           "placements": [{"cloud": "aws", "region": r, "instanceTypes": ["g5.xlarge"]}
                          for r in ["us-east-1", "us-west-2"][:placements]]}
    assert pricing.image_copies(load_settings(raw, stack="t")) is None
    assert plan.image_copies_lines(None, "src") == []


def test_image_copies_without_a_recorded_price_say_so():
    from ops import plan

    (line,) = plan.image_copies_lines(pricing.ImageCopies(2, None, 0.0, 10), "src")
    assert "no recorded registry storage price" in line and "stored in 2 repositories" in line


GCP_FROM_AWS_HOME = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True},
                     "placements": [{"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]},
                                    {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g6.xlarge"]},
                                    {"cloud": "gcp", "region": "us-central1", "project": "my-gpus-42",
                                     "instanceTypes": ["g2-standard-4"]}]}


@pytest.mark.parametrize(("index", "per_hour", "kind"), [
    (0, 0.0, "same region"),
    # 1 GiB every 600 s (the trainer's default), from us-west-2 EC2 to S3 in us-east-1 at $0.02/GB.
    (1, 0.02 * 1024**3 / 1e9 * 6, "inter-region"),
    # The same from GCE to S3 at Google's internet egress, $0.12/GiB: $0.72 an hour.
    (2, 0.12 * 6, "internet"),
])
def test_a_placements_checkpoint_writes_cost_what_its_cloud_bills_to_send_them_home(index, per_hour, kind):
    s = load_settings(GCP_FROM_AWS_HOME, stack="moves")
    assert s.run.checkpoint_every_seconds == 600
    p = s.placement_list[index]
    writes = pricing.checkpoint_writes(s, p.cloud, p.region)
    assert (writes.transfer.kind, writes.checkpoint_bytes) == (kind, 1024**3)
    assert writes.per_hour == pytest.approx(per_hour)
    if index == 2:
        assert round(writes.per_hour, 2) == 0.72
    # Checkpoints by steps only: no hourly rate to give.
    steps_only = load_settings({**GCP_FROM_AWS_HOME, "run": {"synthetic": True, "checkpointEverySeconds": None,
                                                             "checkpointEverySteps": 100}}, stack="moves")
    assert pricing.checkpoint_writes(steps_only, p.cloud, p.region).per_hour is None


def test_synth_plan_prints_each_placements_checkpoint_writes():
    from ops import synth

    raw = GCP_FROM_AWS_HOME
    text = synth.plan(synth.synthesize(raw, stack="moves"), synth.load_source(raw, "moves").settings, ask_prices=False)
    home, west, gce = text.split("Placements: 3, home first", 1)[1].splitlines()[1:4]
    assert "checkpoint writes" not in home
    assert west.endswith("; checkpoint writes: $0.13/h at the 1.0 GiB assumed size, one every 600 s inter-region "
                         "at $0.02/GB"), west
    assert gce.endswith("; checkpoint writes: $0.72/h at the 1.0 GiB assumed size, one every 600 s internet "
                        "at $0.12/GiB"), gce


def test_the_cost_so_far_counts_checkpoint_writes_for_the_time_spent_away_from_home():
    """The machines' recorded price carries their placement's checkpoint writes (spread over the machines), so
    `ops status`'s cost so far (runfolder.cost) counts them for exactly the hours the run trained there."""
    from components import placement
    from components.userdata import price_env
    from runfolder import cost

    s = load_settings({**GCP_FROM_AWS_HOME, "compute": {"nodes": 2}}, stack="moves")
    envs = [price_env(placement.settings_at(s, i)) for i in range(3)]
    machines = [price_env(placement.settings_at(s, i).model_copy(
        update={"run": s.run.model_copy(update={"checkpoint_every_seconds": None, "checkpoint_every_steps": 100})}))
        for i in range(3)]
    writes = [pricing.checkpoint_writes(s, p.cloud, p.region).per_hour for p in s.placement_list]
    for env, bare, w in zip(envs, machines, writes, strict=True):
        assert float(env["TRAINSTACK_PRICE_PER_HOUR"]) == pytest.approx(float(bare["TRAINSTACK_PRICE_PER_HOUR"]) + w / 2,
                                                                         abs=1e-4)
    assert "checkpoint writes" not in envs[0]["TRAINSTACK_PRICE_NOTE"]
    assert " + checkpoint writes to home $0.72/h" in envs[2]["TRAINSTACK_PRICE_NOTE"]

    def started(t: int, i: int) -> dict:
        return {"event": "started", "time": f"2026-12-01T{t:02d}:00:00+00:00", "attempt": i + 1, "workers": 2,
                "config": {"price_per_hour": float(envs[i]["TRAINSTACK_PRICE_PER_HOUR"]),
                           "placement": f"{s.placement_list[i].cloud} {s.placement_list[i].region}"}}

    # An hour at home, then an hour on GCP, still running.
    events = [started(0, 0), {"event": "preempted", "time": "2026-12-01T01:00:00+00:00", "attempt": 1},
              started(1, 2)]
    total = cost.run_cost(events, now=cost.parse_time("2026-12-01T02:00:00+00:00"))
    machines_only = 2 * (float(machines[0]["TRAINSTACK_PRICE_PER_HOUR"]) + float(machines[2]["TRAINSTACK_PRICE_PER_HOUR"]))
    assert total.cost_usd == pytest.approx(machines_only + writes[2], abs=1e-3)


def test_the_controller_is_given_each_placements_types_gpu_estimate_and_transfer_prices():
    from controller import prices

    s = load_settings(GCP_FROM_AWS_HOME, stack="moves")
    home, west, gce = pricing.decision_inputs(s)
    assert (home["instance_types"], home["gpu"], home["restore_per_gb"], home["writes_per_gb"]) == (
        ["g5.xlarge"], "A10G", 0.0, 0.0)
    assert home["estimate_per_hour"] == pytest.approx(1.006 * 0.4)  # the table's spot estimate
    assert (west["gpu"], west["restore_per_gb"], west["writes_per_gb"]) == ("L4", 0.02, 0.02)
    # GCE: S3 sends at AWS's internet price, GCE sends home at Google's; no maximum price; its machine's shape.
    assert (gce["restore_per_gb"], gce["writes_per_gb"], gce["max_price_per_hour"]) == (0.09, 0.12, None)
    assert gce["machines"] == [{"machine_type": "g2-standard-4", "vcpus": 4, "memory_gib": 16,
                                "accelerator": "nvidia-l4", "gpus": 1}]
    # The controller reads them back as what it prices.
    offer = prices.offer(2, "gcp", "us-central1", gce, nodes=1)
    assert offer.machines == (prices.GcpMachine("g2-standard-4", 4, 16, "nvidia-l4", 1),)
    with pytest.raises(ValueError, match=r"^placements\[2\]\.pricing\.machines\[0\]: expected machine_type"):
        prices.offer(2, "gcp", "us-central1", {**gce, "machines": [{"vcpus": 4}]})
    with pytest.raises(ValueError, match=r"^placements\[0\]\.pricing\.instance_types: expected a non-empty list"):
        prices.offer(0, "aws", "us-east-1", {**home, "instance_types": []})


def test_every_gcp_gpu_machine_has_the_shape_the_billing_catalog_prices():
    assert set(catalog.GCP_MACHINE_SHAPES) == set(catalog.GCP_GPU_MACHINES)
    assert catalog.gcp_machine_shape("n1-highmem-8", "nvidia-tesla-t4", 2) == {
        "machine_type": "n1-highmem-8", "vcpus": 8, "memory_gib": 52.0, "accelerator": "nvidia-tesla-t4", "gpus": 2}
    assert catalog.gcp_machine_shape("a3-megagpu-8g")["accelerator"] == "nvidia-h100-mega-80gb"
    assert catalog.gcp_machine_shape("z9-unknown-1") is None


def test_every_gpu_tensorflow_can_use_has_a_relative_throughput():
    from controller.cost import RELATIVE_THROUGHPUT

    models = set(catalog.AWS_GPU_MODELS.values()) | set(catalog.GCP_GPU_MODELS.values()) | set(
        catalog.GCP_N1_ACCELERATORS)
    unusable = {"K80", "M60", "nvidia-tesla-k80"}  # TensorFlow 2.21 has no kernels for them (catalog.TF_UNUSABLE)
    assert models - set(RELATIVE_THROUGHPUT) == unusable
    assert set(RELATIVE_THROUGHPUT) <= models  # no figure for a GPU the stack cannot name
