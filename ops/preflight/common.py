"""What every preflight check returns, and how a list of checks runs: each failure to check is a problem too;
no credentials at all is no list of problems but one line (`NoCredentials`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


class NoCredentials(Exception):
    """No credentials for a cloud were found: every check would fail alike, so preflight says it once."""

    def __init__(self, cloud: str, found_in: str, fix: str) -> None:
        super().__init__(f"no {cloud} credentials found ({found_in}); {fix}, then run preflight again")


@dataclass(frozen=True)
class Problem:
    """One thing that would stop the launch, and what to do about it."""

    what: str
    fix: str

    def line(self) -> str:
        """The problem as the one line preflight prints."""
        return f"{self.what}; fix: {self.fix}"


def run_checks(checks: Iterable[tuple[str, Callable[[], list[Problem]]]],
               describe: Callable[[Exception], str]) -> list[Problem]:
    """Run each named check; one that raises becomes a problem that names it and `describe`s the error."""
    problems: list[Problem] = []
    for name, check in checks:
        try:
            problems += check()
        except Exception as e:  # noqa: BLE001 - a check that cannot run is itself a problem to report
            problems.append(Problem(f"could not check {name}: {describe(e)}",
                                    "check the credentials (and their region/project) and run preflight again"))
    return problems

