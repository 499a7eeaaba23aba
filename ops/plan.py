"""The readable plan `ops synth` ends with: what the stack creates, its machines, and what they cost.

Resources are grouped by type; a value the fake cloud made up (an ARN, the AMI, a subnet,
the account) is marked "(mock)" so nobody mistakes it for their own. The cost section
prices machines x nodes from `components.pricing`: expected $/h (spot as an estimate unless
the cloud's price API answered) and the worst case until `compute.maxRuntimeHours` stops
the group. The storage section says what the run's checkpoints take in the bucket over time
(`components.storage`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from components.pricing import CostEstimate, ImageCopies, PlacementCost


def _money(v: float | None) -> str:
    if v is None:
        return "unknown"
    if v >= 10:
        return f"${v:,.2f}"
    # Below a dollar an hour, the digits that matter (spot prices are quoted to 5-6 places).
    return f"${v:,.3f}" if v >= 1 else "$" + f"{v:.6f}".rstrip("0").rstrip(".")


def _total(v: float | None) -> str:
    return "unknown" if v is None else f"${v:,.2f}"


def _marked(value: Any, mock_values: set[str]) -> str:
    text = value if isinstance(value, str) else str(value)
    return f"{text} (mock)" if any(m in text for m in mock_values) else text


def _mock_inputs(inputs: dict[str, Any], mock_values: set[str], limit: int = 2) -> list[str]:
    out = []
    for k, v in sorted(inputs.items()):
        if isinstance(v, str) and any(m in v for m in mock_values) and len(v) <= 120:
            out.append(f"{k}={v}")
        if len(out) == limit:
            break
    return out


def resources_section(resources: list[dict[str, Any]], mock_values: set[str]) -> list[str]:
    """Resources grouped by type: count, names, and any input that holds a mock value."""
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in resources:
        by_type[r["type"]].append(r)
    lines = [f"Resources ({len(resources)}), by type:"]
    for t in sorted(by_type):
        rs = by_type[t]
        names = ", ".join(r["name"] for r in rs[:3]) + (f", … (+{len(rs) - 3})" if len(rs) > 3 else "")
        lines.append(f"  {len(rs):>2} x {t}: {names}")
        for r in rs:
            for shown in _mock_inputs(r.get("inputs") or {}, mock_values):
                lines.append(f"         {r['name']}: {shown} (mock)")
    return lines


def cost_section(est: CostEstimate, gpus_per_node: int) -> list[str]:
    """Machines x nodes, each type's $/h, the expected $/h and the worst case under the runtime cap."""
    market = "spot" if est.spot else "on-demand"
    nodes = f"{est.nodes} node{'s' if est.nodes != 1 else ''}"
    lines = [f"Machines: {nodes} x {gpus_per_node} GPU, {market}, one of: {', '.join(t.machine_type for t in est.types)}"]
    width = max(len(t.machine_type) for t in est.types)
    for t in est.types:
        od = _money(t.on_demand) + "/h" + (" (list price from before a price cut: likely lower now)"
                                            if t.upper_bound else "")
        row = f"  {t.machine_type:<{width}}  on-demand {od}"
        if est.spot:
            row += f"  spot {_money(t.spot)}/h ({'price API' if t.spot_source == 'api' else 'estimate'})"
        lines.append(row)
    if est.missing:
        lines.append(f"  no recorded price for {', '.join(est.missing)} in {est.region}; "
                     "see components/prices.yaml")
    low, high = est.hourly_low, est.hourly_high
    span = _money(low) if low == high else f"{_money(low)}-{_money(high)}"
    why = ""
    if est.spot:
        why = (" (spot: estimated as a fraction of on-demand, no price API answer)" if est.estimated
               else " (spot: the cloud's current prices)")
    lines.append(f"Expected: {span}/h for {nodes}{why}")
    ceiling = "your maximum price" if est.spot and est.max_price_per_hour is not None else "the on-demand price"
    lines.append(f"Worst case: {_money(est.worst_hourly)}/h ({ceiling} x {nodes}) until the runtime cap "
                 f"({est.max_runtime_hours:g} h): {_total(est.worst_total)}")
    lines.append(f"Prices: on-demand list prices recorded {est.recorded} ({est.source}); not a quote.")
    return lines


def placements_section(rows: list[PlacementCost], groups: list[str], wait_minutes: int, checkpoint: str,
                       transfer_source: str) -> list[str]:
    """The placements: each one's group, machines per hour, and what one restore there reads from the home bucket."""
    lines = [f"Placements: {len(rows)}, home first; the run moves on after placement.waitMinutes ({wait_minutes}) "
             "with no training machine while its group cannot launch"]
    for row, group in zip(rows, groups, strict=True):
        est = row.estimate
        low, high = est.hourly_low, est.hourly_high
        if low is None:
            price = f"no recorded price in {row.region}"
        else:
            market = "spot" + (" estimate" if est.estimated else "") if est.spot else "on-demand"
            price = f"{_money(low)}" + (f"-{_money(high)}" if high != low else "") + f"/h {market}"
        if row.index == 0:
            restore = "restores read the bucket in its own region"
        elif row.restore_cost is None:
            restore = f"restore: no recorded {row.transfer.kind} transfer price"
        else:
            restore = (f"each restore reads one checkpoint ({checkpoint}) {row.transfer.kind} at "
                       f"${row.transfer.per_gb:g}/{row.transfer.unit}: {_money(row.restore_cost)}")
        where = f"{row.index} {row.cloud} {row.region}" + (" (home)" if row.index == 0 else "")
        lines.append(f"  {where}: group {group}; {price}; {restore}{writes_text(row, checkpoint)}")
    lines.append(f"  Transfer prices: {transfer_source}; not a quote.")
    return lines


def writes_text(row: PlacementCost, checkpoint: str) -> str:
    """What the placement's checkpoint writes to the home bucket cost an hour while the run trains there."""
    writes = row.writes
    if writes is None or writes.transfer.per_gb == 0:
        return ""
    if writes.transfer.per_gb is None:
        return f"; checkpoint writes: no recorded {writes.transfer.kind} transfer price"
    if writes.per_hour is None:
        return f"; checkpoint writes: ${writes.transfer.per_gb:g}/{writes.transfer.unit} {writes.transfer.kind} (by steps only: no hourly rate)"
    return (f"; checkpoint writes: ${writes.per_hour:.2f}/h at the {checkpoint} size, one every "
            f"{writes.every_seconds:g} s {writes.transfer.kind} at ${writes.transfer.per_gb:g}/{writes.transfer.unit}")


def image_copies_lines(copies: ImageCopies | None, source: str) -> list[str]:
    """The built image's storage in every placement's region (`pricing.image_copies`); nothing without one."""
    if copies is None:
        return []
    if copies.per_gb_month is None:
        price = "no recorded registry storage price"
    else:
        price = (f"${copies.per_gb_month:g} per GB-month of compressed image in each: "
                 f"{_money(copies.monthly_per_gb())} a month per GB of image in all")
        if copies.free_gb_month:
            price += f" (the first {copies.free_gb_month:g} GB-month is free per billing account)"
    return [f"  Built image: stored in {copies.copies} repositories, one in each placement's region; {price}. "
            f"Each keeps up to {copies.keep_images} images (image.keepImages); layers they share are stored once. "
            f"Registry prices: {source}; not a quote."]


def render(stack: str, cloud: str, region: str, resources: list[dict[str, Any]], outputs: dict[str, Any],
           mock_values: set[str], est: CostEstimate, gpus_per_node: int, storage: list[str] = (),
           placements: list[str] = ()) -> str:
    """The whole plan as text; `storage` is the checkpoint storage section (`components.storage.plan_lines`),
    `placements` the placements' section (`placements_section`, for a stack of several)."""
    lines = [f"Plan for stack {stack} ({cloud}, {region}); offline: values marked (mock) come from the fake "
             "cloud, not your account"]
    lines += resources_section(resources, mock_values)
    if outputs:
        lines.append("Outputs:")
        width = max(len(k) for k in outputs)
        lines += [f"  {k:<{width}}  {_marked(v, mock_values)}" for k, v in sorted(outputs.items())]
    lines += cost_section(est, gpus_per_node)
    lines += list(placements)
    lines += list(storage)
    return "\n".join(lines) + "\n"
