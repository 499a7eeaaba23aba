"""The findings gate: a built image's digest reaches the machines only when its scan has no finding at or
above `image.maxSeverity` that `image.allowFindings` does not let through.

What the clouds' scanners say is read by each cloud's `scan.py` (`components/aws/scan.py`: ECR's
DescribeImageScanFindings, basic or enhanced; `components/gcp/scan.py`: Artifact Analysis
occurrences) into one `Scan`; this module judges it, the same on both clouds, and waits for it
within a bound (`wait`). `components/scan_gate.py` runs both at `pulumi up`.

Fail closed: a scan that does not complete within `image.scanWaitMinutes`, a scan that failed, an
image the scanner does not support, and a repository whose scanning is off all block the digest,
each with one line saying why. There is no key that lets an unscanned image through: an exception
names a finding, and an image nobody scanned has none to name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date

from components.settings.schema import SEVERITIES

# GCP's lowest severity is MINIMAL; ECR's UNDEFINED is a finding with no severity assigned yet. Both read as
# INFORMATIONAL (the lowest): they block only with image.maxSeverity: INFORMATIONAL.
SEVERITY_ALIASES = {"MINIMAL": "INFORMATIONAL", "UNDEFINED": "INFORMATIONAL", "SEVERITY_UNSPECIFIED": "INFORMATIONAL"}
# Seconds between two reads of a scan that has not completed.
POLL_S = 15.0


@dataclass(frozen=True)
class Finding:
    """One vulnerability the scan reported in the image."""

    id: str
    """CVE-… (or the scanner's own id)."""
    severity: str
    """One of SEVERITIES."""
    package: str = ""
    """The package it is in, when the scanner says."""


@dataclass(frozen=True)
class Scan:
    """A read of the image's scan: `done` with its findings, or not yet, or never (`unscanned` says why)."""

    done: bool
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    status: str = ""
    """The scanner's own word for where the scan is (said when the wait runs out)."""
    unscanned: str = ""
    """Non-empty: this scan will never judge the image (failed, unsupported, scanning off); the reason."""


class Blocked(Exception):
    """The digest does not reach the machines: `lines`, one per reason (a finding, an expired exception, no scan)."""

    def __init__(self, digest: str, lines: list[str]):
        self.lines = lines
        super().__init__(f"the image {digest} is kept off the machines:\n" + "\n".join(f"  {line}" for line in lines))


def severity(raw: str) -> str:
    """A scanner's severity as one of SEVERITIES."""
    s = SEVERITY_ALIASES.get(raw.upper(), raw.upper())
    return s if s in SEVERITIES else "INFORMATIONAL"


def blocking(findings: Iterable[Finding], max_severity: str, allowed, today: date) -> list[str]:
    """One line per finding that keeps the image off the machines, naming what lets it through. `allowed`: the
    stack's image.allowFindings (AllowedFinding: id, reason, expires)."""
    floor = SEVERITIES.index(max_severity)
    by_id = {a.id: (i, a) for i, a in enumerate(allowed)}
    lines: list[str] = []
    seen: set[tuple[str, str]] = set()
    for f in sorted(findings, key=lambda f: (-SEVERITIES.index(f.severity), f.id, f.package)):
        if SEVERITIES.index(f.severity) < floor or (f.id, f.package) in seen:
            continue
        seen.add((f.id, f.package))
        where = f" in {f.package}" if f.package else ""
        if f.id in by_id:
            i, a = by_id[f.id]
            if a.expires >= today:
                continue
            lines.append(f"{f.id} ({f.severity}{where}): its exception image.allowFindings[{i}] expired on "
                         f"{a.expires}; look at it again and set a new expires, or rebuild without it")
        else:
            lines.append(f"{f.id} ({f.severity}{where}): at or above image.maxSeverity {max_severity}; fix it and rebuild, "
                         f"or let it through with image.allowFindings (id: {f.id}, reason, expires)")
    return lines


def judge(scan: Scan, digest: str, max_severity: str, allowed, today: date) -> None:
    """Raise Blocked unless the completed `scan` lets `digest` through."""
    if scan.unscanned:
        raise Blocked(digest, [f"no scan judged it: {scan.unscanned}; turn the repository's scanning on (docs/images.md)"])
    lines = blocking(scan.findings, max_severity, allowed, today)
    if lines:
        raise Blocked(digest, lines)


def wait(read: Callable[[], Scan], digest: str, wait_s: float, *, poll_s: float = POLL_S,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Scan:
    """Read the scan until it is done or will never be, for at most `wait_s` (image.scanWaitMinutes); past that,
    raise Blocked. A read that fails for a passing reason is the reader's to retry (botocore's, the client's)."""
    deadline = clock() + wait_s
    while True:
        scan = read()
        if scan.done or scan.unscanned:
            return scan
        if clock() + poll_s > deadline:
            minutes = round(wait_s / 60)
            raise Blocked(digest, [f"its scan did not complete within {minutes} min (image.scanWaitMinutes; last status: "
                                   f"{scan.status or 'none'}); is the repository's scanning on? run `pulumi up` again "
                                   "to wait longer, or raise image.scanWaitMinutes"])
        sleep(poll_s)


def allowance_lines(allowed, today: date) -> list[str]:
    """What `ops synth` can say offline of the exceptions: each, and whether it still lets its finding through."""
    lines = []
    for i, a in enumerate(allowed):
        state = f"until {a.expires}" if a.expires >= today else f"EXPIRED on {a.expires}: blocks like any finding"
        lines.append(f"image.allowFindings[{i}]: {a.id} {state} ({a.reason})")
    return lines
