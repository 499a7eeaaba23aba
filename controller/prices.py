"""The placements' spot prices: live from each cloud, cached in the run folder with their age.

A placement's price is one figure, USD per machine-hour, read from its cloud's own API:

- **AWS**: EC2 ``DescribeSpotPriceHistory`` for the placement's instance types (product
  ``Linux/UNIX``, ``StartTime`` now, which answers each pool's price in effect now), one price per
  pool (type x zone; the placement's ``zones`` when it names them, else every zone EC2 answers for).
  The group's spot allocation strategy is ``price-capacity-optimized`` (components/aws/group.py): EC2
  launches from the pools with the most spare capacity, and among those the cheapest, so the pool it
  picks is neither reliably the cheapest nor the dearest. The price that stands for the group is the
  **median over its pools** (:func:`group_price`; the lower middle of an even count, as the strategy
  leans to the cheap side), with the cheapest and dearest kept beside it: a user is neither promised
  the cheapest pool nor charged for the dearest one. EC2 ``GetSpotPlacementScores`` (1-10, how likely
  a request of ``nodes`` machines of those types succeeds in the region) is read beside it as a capacity
  signal; an account that may not ask, or a partition that does not offer it, answers a refusal, which
  means "no score", never an error.
- **GCP**: the Cloud Billing Catalog API (``GET /v1/services/6F81-5844-456A/skus``, Compute Engine's
  public SKUs, paged by ``nextPageToken``), plain HTTPS with google-auth's ``AuthorizedSession`` (the
  discovery client is not in the function's package; the tests check these requests and answers
  against the ``cloudbilling`` v1 discovery document). A machine's Spot price is its vCPUs x the
  family's Spot core SKU + its GiB x the Spot RAM SKU + its GPUs x the GPU's Spot SKU, each in the
  placement's region (:func:`gcp_sku_prices`: ``category.usageType`` ``Preemptible``, the region in
  ``serviceRegions``, the newest ``pricingInfo``'s first tier, ``unitPrice`` units + nanos per usage
  unit ``h`` or ``GiBy.h``). A GCP placement's price is the median over its machine types, as on AWS.
  Google prices Spot VMs per region, not per zone.

**Caching** (:data:`layout.PRICES_KEY`): every quote carries its ``as_of``, when the cloud answered. A
tick asks a cloud again only when its quote is older than the cloud's refresh interval
(:data:`REFRESH_S`), and a quote older than :data:`STALE_S` counts as unknown. AWS spot prices move
several times a day: refreshed every 10 minutes, unknown after an hour. Google changes Spot prices at
most once a month (its price list, cloud.google.com/skus: "Spot prices are dynamic and can change up to once every 30 days"):
refreshed daily, unknown after 35 days. A refresh that fails keeps the previous quote (and its age),
with the error noted: the run never waits on a price API.

**Unknown prices** (:func:`quotes_for`): when at least one placement has a fresh live price, a placement
without one (never read, or stale) is unknown and ranks after every known one. When no placement has
a fresh live price at all (no API answered, or before the first refresh), the stack's price table
(``components/prices.yaml``, passed in as each placement's ``estimate``) stands in for every
placement, marked ``estimate``: a ranking never mixes live prices with list-price estimates.

Permissions (controller/grants.py): ``ec2:DescribeSpotPriceHistory`` and
``ec2:GetSpotPlacementScores`` (no resource-level permissions: ``*``); the Catalog API needs no IAM
permission (any authenticated caller may list public SKUs), only the Cloud Billing API enabled in the
function's project; the cache itself is one more object the controller writes in the run folder.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

from runfolder import layout
from runfolder.storage.errors import NotFound

# Seconds after which a cloud's quote is asked again, and after which it counts as unknown (module docstring).
REFRESH_S = {"aws": 600.0, "gcp": 86400.0}
STALE_S = {"aws": 3600.0, "gcp": 35 * 86400.0}
CACHE_VERSION = 1
PRODUCT = "Linux/UNIX"
# What EC2 answers for that product: its own name, or the name EC2-Classic-era accounts (and moto) see for the same
# Linux price in a VPC; never another operating system's.
LINUX_PRODUCTS = frozenset({PRODUCT, "Linux/UNIX (Amazon VPC)"})
# EC2's answers that mean "this account or partition may not ask for scores": no score, not an error.
SCORE_REFUSALS = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnsupportedOperation",
                            "InvalidAction", "OptInRequired", "NotImplemented", "InvalidParameterValue"})
# Compute Engine's service id in the Cloud Billing Catalog.
COMPUTE_SERVICE = "services/6F81-5844-456A"
BILLING_API = "https://cloudbilling.googleapis.com/v1"
BILLING_SCOPE = "https://www.googleapis.com/auth/cloud-billing.readonly"
PAGE_SIZE = 5000
MAX_PAGES = 40  # Compute Engine lists tens of thousands of SKUs: a few pages of 5,000; a bound on a looping token
GCP_TIMEOUT_S = 30.0

# Spot SKU descriptions in the catalog, e.g. "Spot Preemptible N1 Predefined Instance Core running in Americas",
# "Spot Preemptible G2 Instance Ram running in Belgium", "Spot Preemptible Nvidia Tesla T4 GPU running in
# Americas", "Nvidia H100 80GB Mega GPU attached to Spot Preemptible VMs running in Tokyo". Custom, sole-tenant,
# reserved and commitment SKUs have other words where these patterns expect the family: they never match.
_CORE_RAM = re.compile(r"^(?:Spot Preemptible )?(?P<family>[A-Z]\d\w*) (?:Predefined )?Instance (?P<what>Core|Ram)"
                       r" running in ")
_GPU = re.compile(r"^(?:Spot Preemptible )?(?P<gpu>Nvidia [\w ]+?) GPU(?: attached to Spot Preemptible VMs)?"
                  r" running in ")
_NOT_SPOT_VM = ("Reserved", "Sole Tenancy", "Commitment", "DWS", "Calendar", "Custom")
# The catalog's GPU names (lowercased, dashes) that differ from Compute Engine's accelerator type names.
_GPU_NAMES = {"nvidia-tesla-a100-80gb": "nvidia-a100-80gb", "nvidia-h100-80gb-mega": "nvidia-h100-mega-80gb",
              "nvidia-h100-80gb-plus": "nvidia-h100-mega-80gb"}
# Machine families whose core and RAM SKUs carry another family name in the catalog.
_GCP_FAMILIES = {"a3-megagpu": "a3plus"}
_USAGE_UNITS = {"core": "h", "gpu": "h", "ram": "GiBy.h"}


class PriceError(RuntimeError):
    """A cloud's price API could not be read or answered nothing usable; the message names the placement."""


@dataclass(frozen=True)
class GcpMachine:
    """A GCP machine type as the catalog prices it: its vCPUs, memory and GPUs (the stack knows them)."""

    machine_type: str
    vcpus: float
    memory_gib: float
    accelerator: str | None = None
    """Compute Engine's accelerator type name (``nvidia-tesla-t4``, ``nvidia-l4``), None without GPUs."""
    gpus: int = 0


@dataclass(frozen=True)
class Offer:
    """What one placement may launch, as its price is asked for."""

    index: int
    cloud: str
    region: str
    instance_types: tuple[str, ...]
    zones: tuple[str, ...] = ()
    """The placement's zones (AWS zone names); empty: every zone of the region."""
    machines: tuple[GcpMachine, ...] = ()
    """GCP only: each of ``instance_types`` with its vCPUs, memory and GPUs."""
    nodes: int = 1

    @property
    def key(self) -> str:
        """The cache's key: what was priced (a placement whose types change is priced again)."""
        return "|".join((self.cloud, self.region, ",".join(self.instance_types), ",".join(self.zones)))


@dataclass(frozen=True)
class Quote:
    """One placement's price per machine-hour and where it comes from."""

    price: float | None
    """USD per machine-hour; None: unknown."""
    source: str
    """``aws`` or ``gcp`` (the cloud's API), ``estimate`` (the stack's price table), ``stale`` (a live price
    past :data:`STALE_S`, unknown now) or ``unknown`` (never read)."""
    as_of: float | None = None
    """When the cloud answered (epoch seconds); None for an estimate or a price never read."""
    low: float | None = None
    """The cheapest pool's (or machine type's) price."""
    high: float | None = None
    """The dearest pool's (or machine type's) price."""
    pools: int = 0
    """Pools (AWS: type x zone) or machine types (GCP) priced."""
    score: int | None = None
    """AWS's spot placement score for the region (1-10), None where there is none."""
    note: str = ""
    """What went wrong on the last refresh, or what the figure is."""

    def age(self, now: float) -> float | None:
        """Seconds since the cloud answered; None without an as_of."""
        return None if self.as_of is None else max(0.0, now - self.as_of)

    @property
    def known(self) -> bool:
        return self.price is not None


def offer(index: int, cloud: str, region: str, pricing: Mapping, *, nodes: int = 1) -> Offer:
    """The :class:`Offer` of placement ``index`` from the document the stack writes for it
    (components/pricing.py's ``decision_inputs``: ``instance_types``, ``zones`` and, on GCP, ``machines``);
    a bad document is a ValueError naming the key."""
    where = f"placements[{index}].pricing."
    types = pricing.get("instance_types")
    if not isinstance(types, list) or not types or not all(isinstance(t, str) and t for t in types):
        raise ValueError(f"{where}instance_types: expected a non-empty list of machine types, got {types!r}")
    zones = pricing.get("zones", [])
    if not isinstance(zones, list) or not all(isinstance(z, str) for z in zones):
        raise ValueError(f"{where}zones: expected a list of zone names, got {zones!r}")
    machines = []
    if cloud == "gcp":
        for j, m in enumerate(pricing.get("machines") or []):
            try:
                machines.append(GcpMachine(machine_type=str(m["machine_type"]), vcpus=float(m["vcpus"]),
                                           memory_gib=float(m["memory_gib"]), accelerator=m.get("accelerator"),
                                           gpus=int(m.get("gpus") or 0)))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{where}machines[{j}]: expected machine_type, vcpus, memory_gib, accelerator and "
                                 f"gpus, got {m!r} ({e})") from None
    return Offer(index=index, cloud=cloud, region=region, instance_types=tuple(types), zones=tuple(zones),
                 machines=tuple(machines), nodes=nodes)


def rank_key(quote: Quote) -> tuple[bool, float]:
    """Sorts known prices cheapest first and every unknown price after them."""
    return (quote.price is None, quote.price if quote.price is not None else 0.0)


def group_price(prices: Iterable[float]) -> tuple[float | None, float | None, float | None]:
    """(the price that stands for the group, the cheapest, the dearest) over a placement's pools: the median,
    the lower of the two middle prices for an even count (module docstring says why)."""
    values = sorted(float(p) for p in prices)
    if not values:
        return None, None, None
    return statistics.median_low(values), values[0], values[-1]


# -- AWS ----------------------------------------------------------------------------------------------


def aws_pool_prices(client, instance_types: Sequence[str], zones: Sequence[str] = (), *,
                    now: float) -> dict[tuple[str, str], float]:
    """Each pool's (instance type, zone) spot price in effect at ``now``, from ``DescribeSpotPriceHistory``
    (paged); only ``zones`` when given. The newest entry of each pool wins (``StartTime`` now answers the
    price in effect, whose timestamp may be days old)."""
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=list(instance_types), ProductDescriptions=[PRODUCT],
        StartTime=datetime.fromtimestamp(now, UTC))
    newest: dict[tuple[str, str], tuple[datetime | None, float]] = {}
    for page in pages:
        for entry in page.get("SpotPriceHistory", []):
            if entry.get("ProductDescription") not in LINUX_PRODUCTS or entry.get("InstanceType") not in instance_types:
                continue
            zone = entry.get("AvailabilityZone", "")
            if zones and zone not in zones:
                continue
            stamp = entry.get("Timestamp")
            pool = (entry["InstanceType"], zone)
            if pool not in newest or (stamp is not None and (newest[pool][0] is None or stamp > newest[pool][0])):
                newest[pool] = (stamp, float(entry["SpotPrice"]))
    return {pool: price for pool, (_stamp, price) in sorted(newest.items())}


def aws_placement_score(client, instance_types: Sequence[str], region: str, nodes: int) -> tuple[int | None, str]:
    """EC2's spot placement score (1-10) for ``nodes`` machines of ``instance_types`` in ``region``, and a note:
    ``(None, "refused: CODE")`` when the account or partition may not ask (a refusal is no score)."""
    import botocore.exceptions

    try:
        answer = client.get_spot_placement_scores(
            InstanceTypes=list(instance_types), TargetCapacity=int(nodes), TargetCapacityUnitType="units",
            SingleAvailabilityZone=False, RegionNames=[region])
    except botocore.exceptions.ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in SCORE_REFUSALS or code.startswith("AccessDenied"):
            return None, f"placement score refused: {code}"
        return None, f"placement score unavailable: {code or e}"
    except Exception as e:  # noqa: BLE001 - a score is a hint: any failure (an answer botocore cannot parse) is none
        return None, f"placement score unavailable: {e}"[:300]
    scores = [int(s["Score"]) for s in answer.get("SpotPlacementScores", [])
              if s.get("Region") in (None, region) and s.get("Score") is not None]
    return (max(scores) if scores else None), ""


def aws_quote(offer: Offer, *, ec2, now: float) -> Quote:
    """A live quote for an AWS placement: its pools' prices (:func:`aws_pool_prices`) and its score."""
    import botocore.exceptions

    try:
        pools = aws_pool_prices(ec2, offer.instance_types, offer.zones, now=now)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise PriceError(f"placement {offer.index} (aws {offer.region}): DescribeSpotPriceHistory failed: {e}") from e
    price, low, high = group_price(pools.values())
    if price is None:
        raise PriceError(f"placement {offer.index} (aws {offer.region}): EC2 has no {PRODUCT} spot price for "
                         f"{', '.join(offer.instance_types)}{' in ' + ', '.join(offer.zones) if offer.zones else ''}")
    score, note = aws_placement_score(ec2, offer.instance_types, offer.region, offer.nodes)
    return Quote(price=round(price, 6), source="aws", as_of=now, low=low, high=high, pools=len(pools), score=score,
                 note=note)


# -- GCP ----------------------------------------------------------------------------------------------


def _money(value: Mapping) -> float:
    """A ``Money`` (``units`` as an int64 string, ``nanos``) as a float."""
    return int(value.get("units") or 0) + int(value.get("nanos") or 0) / 1e9


def _sku_rate(sku: Mapping) -> tuple[float, str] | None:
    """(USD per usage unit of the first tier, the usage unit) of the newest pricing info; None without one."""
    infos = sku.get("pricingInfo") or []
    if not infos:
        return None
    expression = infos[-1].get("pricingExpression") or {}
    tiers = [t for t in expression.get("tieredRates") or [] if float(t.get("startUsageAmount") or 0) == 0]
    if not tiers or tiers[0].get("unitPrice", {}).get("currencyCode", "USD") != "USD":
        return None
    return _money(tiers[0]["unitPrice"]), str(expression.get("usageUnit", ""))


def gcp_sku_prices(pages: Iterable[Mapping], regions: Iterable[str]) -> dict[str, dict[tuple[str, str], float]]:
    """The Spot prices in each of ``regions`` found in the catalog's ``pages`` (ListSkusResponse documents, read
    one at a time: only these small tables are kept), by (``core``, family) and (``ram``, family) in USD per
    vCPU-hour and GiB-hour, and (``gpu``, accelerator type) per GPU-hour. A SKU counts when its ``category`` is
    Compute / ``Preemptible``, the region is among its ``serviceRegions``, its description is a Spot VM's core,
    RAM or GPU (patterns above), and its usage unit is the one that kind is priced in (``h``; ``GiBy.h`` for
    RAM)."""
    found: dict[str, dict[tuple[str, str], float]] = {r: {} for r in regions}
    for page in pages:
        for sku in page.get("skus") or []:
            category = sku.get("category") or {}
            if category.get("resourceFamily") != "Compute" or category.get("usageType") != "Preemptible":
                continue
            wanted = [r for r in sku.get("serviceRegions") or [] if r in found]
            if not wanted:
                continue
            description = str(sku.get("description", ""))
            if any(word in description for word in _NOT_SPOT_VM):
                continue
            if m := _CORE_RAM.match(description):
                key = (m["what"].lower(), m["family"].lower())
            elif m := _GPU.match(description):
                name = m["gpu"].lower().replace(" ", "-")
                key = ("gpu", _GPU_NAMES.get(name, name))
            else:
                continue
            rate = _sku_rate(sku)
            if rate is None or rate[1] != _USAGE_UNITS[key[0]]:
                continue
            for region in wanted:
                found[region][key] = rate[0]
    return found


def gcp_family(machine_type: str) -> str:
    """The catalog's family name of a machine type's cores and RAM: ``n1`` of ``n1-standard-8``, ``a3plus`` of
    ``a3-megagpu-8g``."""
    for prefix, family in _GCP_FAMILIES.items():
        if machine_type.startswith(prefix + "-") or machine_type == prefix:
            return family
    return machine_type.split("-", 1)[0]


def gcp_machine_price(prices: Mapping[tuple[str, str], float], machine: GcpMachine) -> float | None:
    """One machine's Spot USD per hour from :func:`gcp_sku_prices`; None when a part has no price."""
    family = gcp_family(machine.machine_type)
    core, ram = prices.get(("core", family)), prices.get(("ram", family))
    if core is None or ram is None:
        return None
    total = core * machine.vcpus + ram * machine.memory_gib
    if machine.gpus:
        gpu = prices.get(("gpu", machine.accelerator or ""))
        if gpu is None:
            return None
        total += gpu * machine.gpus
    return round(total, 6)


def gcp_catalog_pages(get: Callable[[str, Mapping[str, str]], Mapping], *, max_pages: int = MAX_PAGES,
                      out_of_time: Callable[[], bool] = lambda: False) -> Iterable[Mapping]:
    """The catalog's pages of Compute Engine SKUs: ``get(url, params)`` answers one ListSkusResponse; pages
    follow ``nextPageToken`` until it is empty, at most ``max_pages`` (a token that never ends is an error), and
    none is asked once ``out_of_time()`` (the tick's time for prices is spent: a PriceError, the old quote stays)."""
    url = f"{BILLING_API}/{COMPUTE_SERVICE}/skus"
    token = ""
    for n in range(max_pages):
        if out_of_time():
            raise PriceError(f"the tick's time for prices ran out after {n} pages of the Cloud Billing Catalog")
        params = {"pageSize": str(PAGE_SIZE)}
        if token:
            params["pageToken"] = token
        page = get(url, params)
        yield page
        token = str(page.get("nextPageToken") or "")
        if not token:
            return
    raise PriceError(f"the Cloud Billing Catalog answered more than {max_pages} pages of Compute Engine SKUs")


def gcp_http_get(session, *, timeout_s: float = GCP_TIMEOUT_S) -> Callable[[str, Mapping[str, str]], Mapping]:
    """A ``get`` for :func:`gcp_catalog_pages` over an authorized ``requests`` session (google-auth's
    ``AuthorizedSession``); an answer other than 200 is a :class:`PriceError` with the status."""

    def get(url: str, params: Mapping[str, str]) -> Mapping:
        response = session.get(url, params=dict(params), timeout=timeout_s)
        if response.status_code != 200:
            raise PriceError(f"the Cloud Billing Catalog answered HTTP {response.status_code}: "
                             f"{response.text[:200]}")
        return response.json()

    return get


def gcp_quote(offer: Offer, *, prices: Mapping[tuple[str, str], float], now: float) -> Quote:
    """A live quote for a GCP placement from its region's Spot SKU prices (:func:`gcp_sku_prices`): each machine
    type's Spot price, the median standing for the group."""
    by_type = {m.machine_type: gcp_machine_price(prices, m) for m in offer.machines}
    priced = [p for p in by_type.values() if p is not None]
    price, low, high = group_price(priced)
    if price is None:
        raise PriceError(f"placement {offer.index} (gcp {offer.region}): the catalog has no Spot price for "
                         f"{', '.join(offer.instance_types)} there")
    missing = [t for t, p in by_type.items() if p is None]
    return Quote(price=price, source="gcp", as_of=now, low=low, high=high, pools=len(priced),
                 note=f"no Spot price for {', '.join(missing)}" if missing else "")


# -- the cache in the run folder ----------------------------------------------------------------------


def load(store) -> dict[str, Quote]:
    """The cached quotes by :attr:`Offer.key` (none when the object is absent or unreadable: prices are read
    again, never trusted half)."""
    try:
        doc = json.loads(store.get_bytes(layout.PRICES_KEY))
    except NotFound:
        return {}
    except ValueError:
        return {}
    if not isinstance(doc, dict) or doc.get("version") != CACHE_VERSION or not isinstance(doc.get("quotes"), dict):
        return {}
    quotes = {}
    for key, q in doc["quotes"].items():
        try:
            quotes[key] = Quote(**{k: q[k] for k in q if k in Quote.__dataclass_fields__})
        except TypeError:
            continue
    return quotes


def dump(quotes: Mapping[str, Quote]) -> bytes:
    """The cache's document: ``{"version": 1, "quotes": {key: {price, source, as_of, low, high, pools, score,
    note}}}``."""
    return json.dumps({"version": CACHE_VERSION, "quotes": {k: asdict(q) for k, q in sorted(quotes.items())}},
                      sort_keys=True).encode()


def refresh(cached: Mapping[str, Quote], offers: Sequence[Offer], *, now: float,
            fetch: Callable[[Offer], Quote], out_of_time: Callable[[], bool] = lambda: False
            ) -> tuple[dict[str, Quote], bool]:
    """The cache after asking ``fetch`` for each offer whose live quote is missing or older than its cloud's
    :data:`REFRESH_S`, and whether anything changed. A fetch that fails (:class:`PriceError` or any error of
    the cloud's client) keeps the previous quote and its as_of, with the error as its note. Once
    ``out_of_time()``, nothing more is asked: the rest keep their quotes until a later tick (a tick's time is
    the run's, not the prices')."""
    quotes = dict(cached)
    changed = False
    for offer in offers:
        old = quotes.get(offer.key)
        if old is not None and old.as_of is not None and now - old.as_of < REFRESH_S[offer.cloud]:
            continue
        if out_of_time():
            break
        try:
            quotes[offer.key] = fetch(offer)
        except Exception as e:  # noqa: BLE001 - a price API's failure of any kind leaves the old quote in place
            quotes[offer.key] = replace(old, note=f"refresh failed: {e}"[:300]) if old is not None else Quote(
                price=None, source="unknown", note=f"refresh failed: {e}"[:300])
        changed = True
    return quotes, changed


def quotes_for(cached: Mapping[str, Quote], offers: Sequence[Offer], *, now: float,
               estimates: Mapping[int, float | None]) -> list[Quote]:
    """Each offer's quote for a decision, in ``offers``' order (module docstring: a stale price is unknown; when
    no offer has a fresh live price, every offer takes its ``estimates[index]``, marked ``estimate``)."""
    live = []
    for offer in offers:
        q = cached.get(offer.key)
        if q is None or q.price is None or q.as_of is None:
            live.append(Quote(price=None, source="unknown", note=q.note if q else "never read"))
        elif now - q.as_of > STALE_S[offer.cloud]:
            live.append(replace(q, price=None, source="stale",
                                note=f"{q.source} price of {q.price} is older than {STALE_S[offer.cloud]:.0f} s"))
        else:
            live.append(q)
    if any(q.known for q in live):
        return live
    return [Quote(price=estimates.get(o.index), source="estimate",
                  note="the stack's price table (components/prices.yaml): no live price") for o in offers]


@dataclass
class PriceBook:
    """The price cache of one run folder: read once, refreshed, written back when it changed."""

    store: object
    quotes: dict[str, Quote] = field(default_factory=dict)

    @classmethod
    def open(cls, store) -> PriceBook:
        return cls(store, load(store))

    def update(self, offers: Sequence[Offer], *, now: float, fetch: Callable[[Offer], Quote],
               out_of_time: Callable[[], bool] = lambda: False) -> None:
        """Refresh what is due (:func:`refresh`) and write the cache back when anything changed."""
        self.quotes, changed = refresh(self.quotes, offers, now=now, fetch=fetch, out_of_time=out_of_time)
        if changed:
            self.store.put_bytes(layout.PRICES_KEY, dump(self.quotes))

    def for_decision(self, offers: Sequence[Offer], *, now: float,
                     estimates: Mapping[int, float | None]) -> list[Quote]:
        return quotes_for(self.quotes, offers, now=now, estimates=estimates)


def time_budget(seconds: float, clock: Callable[[], float] = time.monotonic) -> Callable[[], bool]:
    """``out_of_time`` for :func:`refresh` and :func:`live_fetch`: true once ``seconds`` have passed from now."""
    end = clock() + seconds
    return lambda: clock() >= end


def live_fetch(clouds, placements: Mapping[int, object], *, now: float,
               out_of_time: Callable[[], bool] = lambda: False) -> Callable[[Offer], Quote]:
    """The ``fetch`` of :func:`refresh` that asks each placement's cloud as the identity that reaches it
    (``clouds``: :class:`controller.clouds.Clouds`; ``placements``: each offer's
    :class:`~controller.config.Placement` by index). The catalog is read once per tick, page by page, for every
    GCP placement's region at once (its SKUs are the same pages whatever the region: tens of thousands)."""
    by_region: dict[str, dict[tuple[str, str], float]] | None = None

    def fetch(offer: Offer) -> Quote:
        nonlocal by_region
        p = placements[offer.index]
        if offer.cloud == "aws":
            return aws_quote(offer, ec2=clouds.ec2(p), now=now)
        if by_region is None:
            regions = sorted({q.region for q in placements.values() if q.cloud == "gcp"})
            by_region = gcp_sku_prices(gcp_catalog_pages(gcp_http_get(clouds.gcp_session(p)),
                                                         out_of_time=out_of_time), regions)
        return gcp_quote(offer, prices=by_region.get(offer.region, {}), now=now)

    return fetch
