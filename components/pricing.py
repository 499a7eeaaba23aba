"""What a stack's machines cost per hour: the shipped list-price table, and spot prices from AWS when it answers.

`components/prices.yaml` holds on-demand list prices per region (with the date and source
they were recorded from). `hourly_cost(settings)` prices every machine type a stack may get
(machines x nodes), spot as an estimate unless the cloud's API answered (`aws_spot_prices`:
EC2's spot price history through boto3, asked only when AWS credentials are configured),
and the worst case under `compute.maxRuntimeHours`: the cloud stops the group then, and a
spot machine never costs more than the on-demand price (or `compute.maxPricePerHour`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

PRICES_FILE = Path(__file__).with_name("prices.yaml")
_N1 = re.compile(r"^n1-(standard|highmem|highcpu)-(\d+)$")


@functools.cache
def price_table() -> dict[str, Any]:
    """The shipped price table (components/prices.yaml), parsed once."""
    return yaml.safe_load(PRICES_FILE.read_text())


def _region_group(cloud: str, region: str) -> Mapping[str, Any] | None:
    return next((g for g in price_table().get(cloud, []) if region in g["regions"]), None)


def on_demand_price(cloud: str, region: str, machine_type: str, *, accelerator: str | None = None,
                    gpus: int = 1) -> float | None:
    """The recorded on-demand $/h of one machine, or None when the table has no price for it there.

    GCP N1 machines are priced per vCPU plus `gpus` x the `accelerator`'s hourly price.
    """
    group = _region_group(cloud, region)
    if group is None:
        return None
    m = _N1.match(machine_type) if cloud == "gcp" else None
    if m:
        per_vcpu = (group.get("n1_per_vcpu") or {}).get(m.group(1))
        gpu = (group.get("accelerators") or {}).get(accelerator or "")
        if per_vcpu is None or gpu is None:
            return None
        return round(per_vcpu * int(m.group(2)) + gpu * gpus, 6)
    price = (group.get("on_demand") or {}).get(machine_type)
    return None if price is None else float(price)


def is_upper_bound(cloud: str, region: str, machine_type: str) -> bool:
    """Whether the recorded price predates a known price cut (the real price is likely lower)."""
    group = _region_group(cloud, region)
    return bool(group) and machine_type in (group.get("upper_bound") or [])


def _aws_credentials_configured() -> bool:
    # Asked only when the user has configured credentials: an offline synth must not wait on
    # the instance metadata service probing a laptop for credentials it does not have.
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_PROFILE") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") \
            or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return True
    files = (env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), env.get("AWS_CONFIG_FILE", "~/.aws/config"))
    return any(Path(f).expanduser().is_file() for f in files)


def aws_spot_prices(region: str, instance_types: Sequence[str], *, client: Any = None) -> dict[str, float] | None:
    """Current Linux spot $/h per instance type in `region` (the mean over its zones), from EC2.

    None when AWS credentials are not configured or EC2 does not answer (no network, no
    permission): the caller then estimates. Needs `ec2:DescribeSpotPriceHistory`.
    """
    import boto3
    import botocore.config
    import botocore.exceptions

    if client is None:
        if not _aws_credentials_configured():
            return None
        client = boto3.client("ec2", region_name=region, config=botocore.config.Config(
            connect_timeout=3, read_timeout=5, retries={"max_attempts": 1}))
    try:
        # StartTime now gives each zone's price in effect now.
        pages = client.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=list(instance_types), ProductDescriptions=["Linux/UNIX"], StartTime=datetime.now(UTC))
        latest: dict[tuple[str, str], tuple[Any, float]] = {}
        for page in pages:
            for p in page.get("SpotPriceHistory", []):
                if not str(p.get("ProductDescription", "")).startswith("Linux/UNIX"):
                    continue
                key = (p["InstanceType"], p.get("AvailabilityZone", ""))
                stamp = p.get("Timestamp")
                if key not in latest or (stamp is not None and latest[key][0] is not None and stamp > latest[key][0]):
                    latest[key] = (stamp, float(p["SpotPrice"]))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
        return None
    by_type: dict[str, list[float]] = {}
    for (t, _zone), (_stamp, price) in latest.items():
        by_type.setdefault(t, []).append(price)
    return {t: round(statistics.fmean(v), 6) for t, v in by_type.items()}


@dataclass(frozen=True)
class TypePrice:
    """One machine type's hourly prices for a stack."""

    machine_type: str
    on_demand: float | None
    """Recorded on-demand list $/h, None when the table has none for this region."""
    spot: float | None
    """Spot $/h: from the cloud's API when `spot_source` is "api", else estimated from on-demand."""
    spot_source: str
    """"api" or "estimate"."""
    upper_bound: bool = False
    """The on-demand price predates a known price cut."""


@dataclass(frozen=True)
class CostEstimate:
    """What a stack costs per hour and at most, with where each figure comes from."""

    cloud: str
    region: str
    nodes: int
    spot: bool
    max_runtime_hours: float
    types: list[TypePrice]
    max_price_per_hour: float | None = None
    recorded: str = ""
    source: str = ""
    missing: list[str] = field(default_factory=list)
    """Types without a recorded price in this region."""

    def _per_machine(self) -> list[float]:
        vals = [(t.spot if self.spot else t.on_demand) for t in self.types]
        return [v for v in vals if v is not None]

    @property
    def hourly_low(self) -> float | None:
        """Expected $/h for all nodes on the cheapest type, or None when nothing is priced."""
        vals = self._per_machine()
        return round(min(vals) * self.nodes, 6) if vals else None

    @property
    def hourly_high(self) -> float | None:
        """Expected $/h for all nodes on the dearest type."""
        vals = self._per_machine()
        return round(max(vals) * self.nodes, 6) if vals else None

    @property
    def estimated(self) -> bool:
        """True when a spot figure is an estimate (the cloud's API did not answer)."""
        return self.spot and any(t.spot_source != "api" for t in self.types)

    @property
    def worst_hourly(self) -> float | None:
        """The most the group can cost per hour: spot never exceeds on-demand, nor on AWS the set maximum
        price (GCE Spot VMs have none: a GCP placement of an AWS home pays GCE's Spot price)."""
        ceilings = [t.on_demand for t in self.types if t.on_demand is not None]
        if not ceilings or self.missing:
            return None
        per_machine = max(ceilings)
        if self.spot and self.max_price_per_hour is not None and self.cloud == "aws":
            per_machine = min(per_machine, self.max_price_per_hour)
        return round(per_machine * self.nodes, 6)

    @property
    def worst_total(self) -> float | None:
        """The worst case until the runtime cap stops the group (a price per hour x hours)."""
        w = self.worst_hourly
        return None if w is None else round(w * self.max_runtime_hours, 2)


def hourly_cost(settings: Any, *, spot_prices: Mapping[str, float] | None = None) -> CostEstimate:
    """Price a validated `components.settings.Settings`: every type it may get, x nodes.

    `spot_prices` are the cloud's answer (e.g. `aws_spot_prices`); types it does not name
    get the estimate (`spot_estimate_fraction` x on-demand).
    """
    table = price_table()
    c = settings.compute
    fraction = float(table.get("spot_estimate_fraction", 0.4))
    types, missing = [], []
    for t in c.instance_types:
        od = on_demand_price(settings.cloud, settings.region, t, accelerator=c.accelerator, gpus=c.gpus_per_node)
        if od is None:
            missing.append(t)
        if spot_prices and t in spot_prices:
            spot, source = float(spot_prices[t]), "api"
        else:
            spot, source = (None if od is None else round(od * fraction, 6)), "estimate"
        types.append(TypePrice(t, od, spot, source, is_upper_bound(settings.cloud, settings.region, t)))
    return CostEstimate(
        cloud=settings.cloud, region=settings.region, nodes=c.nodes, spot=c.spot,
        max_runtime_hours=c.max_runtime_hours, types=types, max_price_per_hour=c.max_price_per_hour,
        recorded=str(table.get("recorded", "")), source=str(table.get("source", "")), missing=missing,
    )


# The continent of a region, by its name's first part, for GCS's same-continent transfer price.
_CONTINENTS = {"us": "north-america", "northamerica": "north-america", "southamerica": "south-america",
               "europe": "europe", "asia": "asia", "australia": "oceania", "me": "middle-east", "africa": "africa"}


# The bytes of the unit each cloud's transfer prices are per: AWS bills per GB (10^9 bytes), Google per GiB
# (2^30 bytes: its network pricing says "GiB"), about 7 % more bytes for the same price.
TRANSFER_UNIT_BYTES = {"aws": 10**9, "gcp": 2**30}
_UNIT_NAMES = {10**9: "GB", 2**30: "GiB"}


@dataclass(frozen=True)
class Transfer:
    """What reading bytes from the home bucket costs a placement, per unit of the sender's cloud (`unit`)."""

    per_gb: float | None
    """USD per `unit_bytes` (AWS: GB, 10^9 bytes; GCP: GiB, 2^30 bytes); 0 in the bucket's own region; None when
    the table has no price."""
    kind: str
    """"same region", "inter-region", "same continent", "inter-continent" or "internet"."""
    unit_bytes: int = 10**9
    """The bytes `per_gb` is the price of: the sending cloud's billing unit (TRANSFER_UNIT_BYTES)."""

    @property
    def unit(self) -> str:
        """The billing unit's name, "GB" or "GiB", as the price is written ($0.12/GiB)."""
        return _UNIT_NAMES.get(self.unit_bytes, f"{self.unit_bytes} bytes")

    def cost(self, nbytes: float) -> float | None:
        """USD to move `nbytes`; None without a price."""
        return None if self.per_gb is None else self.per_gb * nbytes / self.unit_bytes


def transfer_per_gb(home_cloud: str, home_region: str, cloud: str, region: str) -> Transfer:
    """The list price of moving data from a bucket in `home_region` to machines in `region` (components/prices.yaml)."""
    table = price_table().get("transfer") or {}
    prices = table.get(home_cloud) or {}
    unit = TRANSFER_UNIT_BYTES[home_cloud]
    if cloud != home_cloud:
        kind = "internet"
    elif region == home_region:
        return Transfer(0.0, "same region", unit)
    elif home_cloud == "aws":
        kind = "inter-region"
    else:
        same = _CONTINENTS.get(home_region.split("-")[0]) == _CONTINENTS.get(region.split("-")[0]) is not None
        kind = "same continent" if same else "inter-continent"
    price = prices.get(kind.replace("-", "_").replace(" ", "_"))
    return Transfer(None if price is None else float(price), kind, unit)


@dataclass(frozen=True)
class CheckpointWrites:
    """What a placement's checkpoint writes to the home bucket cost while the run trains there: each checkpoint
    leaves the placement's region (and cloud) every `run.checkpointEverySeconds`, billed by the sender's cloud."""

    transfer: Transfer
    """The sender's (the placement's) price per GB (GiB on GCP) to home's bucket: "same region" (0) at home."""
    checkpoint_bytes: int
    """Bytes of one checkpoint (`components.storage.ASSUMED_CHECKPOINT_BYTES` unless a size is known)."""
    every_seconds: float | None
    """Seconds between the time trigger's checkpoints; None when the run checkpoints by steps only."""

    @property
    def per_hour(self) -> float | None:
        """USD an hour of training there; None without a price or a time trigger (step checkpoints add to it)."""
        if self.transfer.per_gb is None or not self.every_seconds:
            return None
        return self.transfer.cost(self.checkpoint_bytes) * 3600 / self.every_seconds


def checkpoint_writes(settings: Any, cloud: str, region: str, *, checkpoint_bytes: int | None = None) -> CheckpointWrites:
    """The checkpoint writes of a run training in `cloud` `region`, to the bucket of its home placement."""
    from components.storage import ASSUMED_CHECKPOINT_BYTES

    home = settings.placement_list[0]
    return CheckpointWrites(transfer_per_gb(cloud, region, home.cloud, home.region),
                            ASSUMED_CHECKPOINT_BYTES if checkpoint_bytes is None else checkpoint_bytes,
                            settings.run.checkpoint_every_seconds)


@dataclass(frozen=True)
class PlacementCost:
    """One placement's machines per hour, what a restore there reads from the home bucket, and what its
    checkpoint writes to the home bucket cost an hour."""

    index: int
    cloud: str
    region: str
    estimate: CostEstimate
    transfer: Transfer
    restore_bytes: int
    writes: CheckpointWrites | None = None

    @property
    def restore_cost(self) -> float | None:
        """USD to read one checkpoint from the home bucket into this placement."""
        cost = self.transfer.cost(self.restore_bytes)
        return None if cost is None else round(cost, 4)


def placement_costs(settings: Any, *, checkpoint_bytes: int) -> list[PlacementCost]:
    """Every placement's hourly prices and per-restore transfer cost of a `checkpoint_bytes` checkpoint, home first."""
    from components import placement

    rows = []
    for i, p in enumerate(settings.placement_list):
        moved = placement.settings_at(settings, i)
        rows.append(PlacementCost(i, p.cloud, p.region, hourly_cost(moved),
                                  transfer_per_gb(settings.cloud, settings.region, p.cloud, p.region),
                                  checkpoint_bytes,
                                  checkpoint_writes(settings, p.cloud, p.region, checkpoint_bytes=checkpoint_bytes)))
    return rows


def decision_inputs(settings: Any) -> list[dict[str, Any]]:
    """What the placement controller prices and costs each placement by, home first, as JSON-ready documents
    (controller/prices.py's ``offer``, controller/cost.py's PlacementFacts): ``{"instance_types", "zones", "gpu",
    "estimate_per_hour", "restore_per_gb", "writes_per_gb", "max_price_per_hour"}`` and, on GCP, ``"machines"``
    (each type's vCPUs, memory and GPUs, which the Billing Catalog prices). ``estimate_per_hour`` is the price
    table's spot estimate standing in when no cloud answers: the median of the placement's types, as a live price
    is; ``restore_per_gb`` what home's bucket sends there, ``writes_per_gb`` what the placement sends home."""
    from components import placement
    from components.catalog import gcp_machine_shape, gpu_model

    home = settings.placement_list[0]
    rows = []
    for i, p in enumerate(settings.placement_list):
        moved = placement.settings_at(settings, i)
        c = moved.compute
        spots = sorted(t.spot for t in hourly_cost(moved).types if t.spot is not None)
        row: dict[str, Any] = {
            "instance_types": list(c.instance_types), "zones": list(c.zones),
            "gpu": gpu_model(p.cloud, c.instance_types[0], c.accelerator),
            "estimate_per_hour": statistics.median_low(spots) if spots else None,
            "restore_per_gb": transfer_per_gb(home.cloud, home.region, p.cloud, p.region).per_gb,
            "writes_per_gb": transfer_per_gb(p.cloud, p.region, home.cloud, home.region).per_gb,
            # GCE Spot VMs take no maximum price (docs/placements.md).
            "max_price_per_hour": c.max_price_per_hour if p.cloud == "aws" else None,
        }
        if p.cloud == "gcp":
            row["machines"] = [m for t in c.instance_types
                               if (m := gcp_machine_shape(t, c.accelerator, c.gpus_per_node)) is not None]
        rows.append(row)
    return rows


# The boot to the first step the controller assumes for a replacement in each cloud until the run has measured one
# (controller/choice.py): the slow end of a GPU image's first boot (drivers, the image pull, the trainer's start).
DECISION_BOOT_S = {"aws": 600, "gcp": 600}


def decision_document(settings: Any) -> dict[str, Any]:
    """What the controller's price decision is told (controller/choice.py reads it, ``Inputs``): the policy and
    move threshold (``trainstack:placement``), the run's steps, checkpoint cadence and assumed checkpoint size, the
    boots, and each placement's price inputs (``decision_inputs``), home first.

    It travels as a file in the function's code package, not in its environment: Lambda's variables share 4 KB,
    which TRAINSTACK_PLACEMENTS nearly fills with eight placements (docs/placements.md)."""
    from components.storage import ASSUMED_CHECKPOINT_BYTES

    p = settings.placement
    return {
        "policy": p.choose, "rebalance": p.rebalance, "move_floor_usd": p.move_floor_usd,
        "move_fraction": p.move_fraction, "steps": settings.run.steps,
        "checkpoint_every_s": settings.run.checkpoint_every_seconds, "checkpoint_bytes": ASSUMED_CHECKPOINT_BYTES,
        "boot_s": dict(DECISION_BOOT_S), "placements": decision_inputs(settings),
    }


def decision_json(settings: Any) -> str:
    """``decision_document`` as the file the function's package holds (keys sorted)."""
    return json.dumps(decision_document(settings), sort_keys=True, indent=1) + "\n"


@dataclass(frozen=True)
class ImageCopies:
    """A built image's storage with several placements: one repository in each placement's region."""

    copies: int
    """Repositories holding the image: home's and one per other placement."""
    per_gb_month: float | None
    """USD per GB-month of compressed image in one repository; None when the table has no price."""
    free_gb_month: float
    """GB-months a month the registry does not bill (per billing account)."""
    keep_images: int
    """Images each repository keeps (`image.keepImages`)."""

    def monthly_per_gb(self) -> float | None:
        """USD a month for each GB of compressed image, over every copy (before the free allowance)."""
        return None if self.per_gb_month is None else round(self.copies * self.per_gb_month, 4)


def image_copies(settings: Any) -> ImageCopies | None:
    """What storing the built image in every placement's region costs, per GB of image; None unless
    the image is built and mirrored (`image.build` with several placements)."""
    from components.common import mirrored_image

    if not mirrored_image(settings):
        return None
    prices = (price_table().get("registry") or {}).get(settings.cloud) or {}
    price = prices.get("storage_gb_month")
    return ImageCopies(len(settings.placement_list), None if price is None else float(price),
                       float(prices.get("free_gb_month", 0.0)), settings.image.keep_images)


def registry_source() -> str:
    """Where the registry storage prices come from, and when they were recorded."""
    table = price_table().get("registry") or {}
    return f"recorded {table.get('recorded', '?')} ({table.get('source', 'no source recorded')})"


def transfer_source() -> str:
    """Where the transfer prices come from, and when they were recorded."""
    table = price_table().get("transfer") or {}
    return f"recorded {table.get('recorded', '?')} ({table.get('source', 'no source recorded')})"
