"""What the controller's tests share: groups on moto_server in two regions, a run's files written
as the trainer writes them, and a store that holds two writers at the same point."""

from __future__ import annotations

import json
import threading
import uuid

import boto3

from controller import record as records
from controller.config import Config, parse
from controller.record import iso
from controller.tick import tick
from runfolder import layout
from runfolder.lease import LeaseRecord

REGIONS = ("us-east-1", "us-west-2")


def make_group(region: str, size: int, *, name: str | None = None) -> str:
    """An Auto Scaling group of ``size`` machines on moto_server (AWS_ENDPOINT_URL) in ``region``; its name."""
    name = name or f"trainstack-{uuid.uuid4().hex[:8]}-gpu"
    ec2 = boto3.client("ec2", region_name=region)
    ec2.create_launch_template(LaunchTemplateName=name,
                               LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
    boto3.client("autoscaling", region_name=region).create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": name}, MinSize=size, MaxSize=size,
        DesiredCapacity=size, AvailabilityZones=[f"{region}a"])
    return name


def sizes(config: Config) -> list[int]:
    """Each placement's group's desired size, in placement order (read with the admin's client)."""
    out = []
    for p in config.placements:
        g = boto3.client("autoscaling", region_name=p.region).describe_auto_scaling_groups(
            AutoScalingGroupNames=[p.group])["AutoScalingGroups"][0]
        out.append(g["DesiredCapacity"])
    return out


def aws_config(run_uri: str, groups: list[str], *, nodes: int = 1, wait_minutes: int = 15) -> Config:
    return parse(json.dumps({"run_uri": run_uri, "nodes": nodes, "wait_minutes": wait_minutes, "placements": [
        {"cloud": "aws", "region": region, "project": None, "group": group}
        for region, group in zip(REGIONS, groups, strict=True)]}))


def trained(store, *, step: int, last_beat: float, lease_released: bool = True, lease_until: float | None = None):
    """A run a machine trained up to ``step`` (committed) whose last heartbeat was at ``last_beat``."""
    store.put_bytes(layout.committed_key(step), json.dumps({"step": step}).encode())
    store.put_bytes(layout.PROGRESS_KEY, json.dumps({"step": step, "updated": iso(last_beat)}).encode())
    store.put_bytes(layout.EVENTS_KEY, (json.dumps({layout.EVENT: layout.PREEMPTED, layout.TIME: iso(last_beat),
                                                    layout.ATTEMPT: 1, "step": step}) + "\n").encode())
    until = last_beat + 60 if lease_until is None else lease_until
    store.put_bytes(layout.LEASE_KEY, LeaseRecord(holder="i-0aaa/1", token="t", epoch=1, ttl_s=60.0, expires=until,
                                                  released=lease_released, nonce="n").dump())


def moved_events(store) -> list[dict]:
    events, _ = records.read_events(store)
    return [e for e in events if e.get(layout.EVENT) == layout.MOVED]


class MeetingStore:
    """A store whose writes of ``placement.json`` wait until ``parties`` writers are there: both have
    read the same version before either writes, so the store's condition alone decides."""

    def __init__(self, store, parties: int = 2) -> None:
        self._store = store
        self.barrier = threading.Barrier(parties, timeout=60)
        self.refused = 0
        self._lock = threading.Lock()
        self._met = False

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def put_bytes_if(self, key: str, data: bytes, *, version):
        if key == layout.PLACEMENT_KEY and not self._met:
            self.barrier.wait()
            self._met = True
        try:
            return self._store.put_bytes_if(key, data, version=version)
        except Exception as e:
            if type(e).__name__ == "PreconditionFailed":
                with self._lock:
                    self.refused += 1
            raise


class FakeGroups:
    """Groups kept in memory (for the tests about the run folder, not the cloud)."""

    def __init__(self, sizes: dict[str, int], *, state=None) -> None:
        self.sizes = dict(sizes)
        self.calls: list[tuple[str, int]] = []
        self._state = state
        self._lock = threading.Lock()

    def desired(self, p) -> int:
        return self.sizes[p.group]

    def set_size(self, p, n: int) -> None:
        with self._lock:
            self.calls.append((p.group, n))
            self.sizes[p.group] = n

    def state(self, p):
        return self._state(p)


def race(config, clouds, store, now: float) -> tuple[MeetingStore, list]:
    """Two ticks at once over one store whose writers meet (MeetingStore); both must return."""
    meeting = MeetingStore(store)
    results, errors = [], []

    def one() -> None:
        try:
            results.append(tick(config, clouds, now, store=meeting))
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and len(results) == 2
    return meeting, results
