"""The findings gate's own rules (components/findings.py), the same on both clouds: the bounded wait for a
scan on a virtual clock, severities, one line per blocking finding, and the settings that feed it."""

from __future__ import annotations

from datetime import date

import pytest

from components import findings
from components.findings import Blocked, Finding, Scan
from components.settings import ConfigError, load_settings

DIGEST = "sha256:" + "c" * 64


class _Clock:
    def __init__(self):
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_the_wait_reads_until_the_scan_is_done():
    clock, reads = _Clock(), iter([Scan(done=False, status="PENDING"), Scan(done=False, status="IN_PROGRESS"),
                                   Scan(done=True, findings=(Finding("CVE-2024-1", "LOW"),))])
    got = findings.wait(lambda: next(reads), DIGEST, 600, poll_s=15, clock=clock.now, sleep=clock.sleep)
    assert got.done and clock.sleeps == [15, 15]


def test_a_scan_that_never_completes_blocks_within_its_bound_naming_the_key():
    clock, reads = _Clock(), []

    def read():
        reads.append(clock.t)
        return Scan(done=False, status="ScanNotFoundException")

    with pytest.raises(Blocked) as e:
        findings.wait(read, DIGEST, 30 * 60, poll_s=15, clock=clock.now, sleep=clock.sleep)
    assert clock.t <= 30 * 60 and len(reads) == 121
    assert e.value.lines == ["its scan did not complete within 30 min (image.scanWaitMinutes; last status: "
                             "ScanNotFoundException); is the repository's scanning on? run `pulumi up` again to wait "
                             "longer, or raise image.scanWaitMinutes"]
    assert str(e.value).startswith(f"the image {DIGEST} is kept off the machines:\n  its scan did not complete")


def test_a_scan_that_will_never_judge_returns_at_once_to_be_refused():
    clock = _Clock()
    got = findings.wait(lambda: Scan(done=False, unscanned="x"), DIGEST, 600, clock=clock.now, sleep=clock.sleep)
    assert got.unscanned == "x" and clock.sleeps == []


@pytest.mark.parametrize(("raw", "want"), [("critical", "CRITICAL"), ("MINIMAL", "INFORMATIONAL"),
                                          ("UNDEFINED", "INFORMATIONAL"), ("weird", "INFORMATIONAL")])
def test_each_scanners_severity_reads_as_one_of_ours(raw, want):
    assert findings.severity(raw) == want


def test_one_line_per_blocking_finding_worst_first_each_once_and_below_the_floor_none():
    found = [Finding("CVE-2024-2", "HIGH", "a"), Finding("CVE-2024-1", "CRITICAL", "b"),
             Finding("CVE-2024-1", "CRITICAL", "b"), Finding("CVE-2024-3", "MEDIUM", "c")]
    lines = findings.blocking(found, "HIGH", [], date(2026, 1, 1))
    assert [line.split(":")[0] for line in lines] == ["CVE-2024-1 (CRITICAL in b)", "CVE-2024-2 (HIGH in a)"]
    assert findings.blocking(found, "CRITICAL", [], date(2026, 1, 1))[0].endswith(
        "let it through with image.allowFindings (id: CVE-2024-1, reason, expires)")


BASE = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True}}
OK = {"id": "CVE-2024-3094", "reason": "not reachable: sshd is not in the image", "expires": "2027-01-01"}


@pytest.mark.parametrize(("image", "message"), [
    ({"build": True, "maxSeverity": "SEVERE"}, "image.maxSeverity: 'SEVERE': expected INFORMATIONAL, LOW, MEDIUM, HIGH or CRITICAL"),
    ({"build": True, "allowFindings": [{**OK, "id": "CVE-1"}]}, "image.allowFindings[0].id: 'CVE-1': expected a CVE id"),
    ({"build": True, "allowFindings": [{**OK, "reason": "ok"}]}, "image.allowFindings[0].reason: 'ok': expected a reason"),
    ({"build": True, "allowFindings": [{**OK, "expires": "2026-13-01"}]}, "image.allowFindings[0].expires: '2026-13-01': expected a date as YYYY-MM-DD"),
    ({"build": True, "allowFindings": [{**OK, "expires": "2099-01-01"}]}, "image.allowFindings[0].expires: '2099-01-01': more than a year ahead"),
    ({"build": True, "allowFindings": [OK, OK]}, "CVE-2024-3094 is listed more than once"),
    ({"build": True, "scanWaitMinutes": 0}, "image.scanWaitMinutes: 0: expected 1 or more"),
    ({"allowFindings": [OK]}, "image.allowFindings: applies to the scan of an image the stack builds; set image.build: true"),
    ({"maxSeverity": "HIGH"}, "image.maxSeverity: applies to the scan of an image the stack builds"),
])
def test_the_gates_settings_are_refused_in_one_line_naming_the_key(image, message):
    with pytest.raises(ConfigError) as e:
        load_settings({**BASE, "image": image}, stack="t")
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("trainstack:image.")


def test_the_gates_defaults_block_at_critical_and_wait_half_an_hour():
    image = load_settings({**BASE, "image": {"build": True, "allowFindings": [OK]}}, stack="t").image
    assert (image.max_severity, image.scan_wait_minutes) == ("CRITICAL", 30)
    assert image.allow_findings[0].expires == date(2027, 1, 1)
