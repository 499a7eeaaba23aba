"""Where the suite's CPU goes: a pytest plugin that writes each test's CPU seconds, by hand, not in CI.

    CPU_PROFILE_DIR=build/cpu python -m pytest -p tests.cpu_profile tests/trainer/test_chaos.py
    python -m tests.cpu_profile build/cpu          # files and tests by CPU

A test's CPU is the pytest process's own, its reaped children's (`RUSAGE_CHILDREN`), and what
its live descendants spent during the test, read from /proc at its start and end. The last
part is what `RUSAGE_CHILDREN` alone misses: moto_server, the fake CLI server and the warm trainer server and their forks,
a metadata service or a trainer still running when the test ends, or a child that reaps a
grandchild, are counted only when the pytest process reaps them (a server at the end of the
session, and then charged to whichever test reaped it). A descendant that was alive at the
test's start and gone at its end is counted by its reaper; its CPU before the test is taken
off. A thread polls the process tree every half second, so each test also records the
processes it started (`procs`), the Python ones (`py`), those that loaded TensorFlow (`tf`:
`_pywrap_tensorflow` in their memory maps) and the commands that cost the most (`kinds`).
A process that leaves the tree (a double fork, `setsid` and re-parenting to init) is not
followed: `left` names the processes the test started that were still running at its end.

Each xdist worker writes `<dir>/<worker>.jsonl`, a JSON object per test.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import resource
import sys
import threading
import time

import pytest

_TICK = os.sysconf("SC_CLK_TCK")
_lock = threading.Lock()
_current: dict[str, str | None] = {"test": None}
_seen: dict[tuple[int, int], dict] = {}  # (pid, start time) -> what the poll saw of it
_outcomes: dict[str, str] = {}  # test id -> passed, failed or skipped (a failed setup or teardown: failed)


def _table() -> dict[int, dict]:
    """Every process: parent, CPU seconds (its own and its reaped children's), start time, name."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # fields[0] is field 3 (state) of proc(5)
        out[int(name)] = {"ppid": int(fields[1]), "cpu": sum(int(x) for x in fields[11:15]) / _TICK,
                          "start": int(fields[19]), "comm": stat[stat.find("(") + 1:stat.rfind(")")]}
    return out


def _descendants(root: int) -> dict[tuple[int, int], dict]:
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, p in table.items():
        children.setdefault(p["ppid"], []).append(pid)
    found, stack = {}, [root]
    while stack:
        for pid in children.get(stack.pop(), []):
            found[(pid, table[pid]["start"])] = table[pid]
            stack.append(pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _loaded_tensorflow(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "_pywrap_tensorflow" in f.read()
    except OSError:
        return False


def _poll(root: int) -> None:
    while True:
        time.sleep(0.5)
        try:
            tree = _descendants(root)
        except OSError:
            continue
        now = time.monotonic()
        with _lock:
            for key, p in tree.items():
                seen = _seen.get(key)
                if seen is None:
                    cmd = _cmdline(key[0])
                    seen = _seen[key] = {"test": _current["test"], "cmd": cmd or p["comm"], "tf": False,
                                         "python": "python" in cmd + p["comm"], "first": now, "cpu": 0.0}
                seen["cpu"] = max(seen["cpu"], p["cpu"])
                # TensorFlow loads in a process's first seconds; a server is not read for ever.
                if seen["python"] and not seen["tf"] and now - seen["first"] < 60:
                    seen["tf"] = _loaded_tensorflow(key[0])


def _kinds(started: list[dict]) -> list[list]:
    """The commands a test started, by program and first arguments: [command, count, CPU s]."""
    by: dict[str, list] = {}
    for p in started:
        words = p["cmd"].split()[:4]
        kind = " ".join(os.path.basename(w) for w in words)[:90]
        row = by.setdefault(kind, [0, 0.0])
        row[0] += 1
        row[1] += p["cpu"]
    return sorted(([k, n, round(c, 2)] for k, (n, c) in by.items()), key=lambda r: -r[2])[:25]


def _rusage() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def pytest_configure(config) -> None:
    threading.Thread(target=_poll, args=(os.getpid(),), daemon=True).start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed or report.when == "call" or (report.skipped and item.nodeid not in _outcomes):
        _outcomes[item.nodeid] = "failed" if report.failed else report.outcome


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    root = os.getpid()
    before = _descendants(root)
    self0, reaped0 = _rusage()
    t0 = time.monotonic()
    _current["test"] = item.nodeid
    yield
    self1, reaped1 = _rusage()
    wall = time.monotonic() - t0
    after = _descendants(root)
    live = sum(p["cpu"] - (before[k]["cpu"] if k in before else 0.0) for k, p in after.items())
    gone_before = sum(p["cpu"] for k, p in before.items() if k not in after)
    with _lock:
        started = [dict(p) for p in _seen.values() if p["test"] == item.nodeid]
    row = {"id": item.nodeid, "outcome": _outcomes.pop(item.nodeid, "?"), "wall": round(wall, 2), "self": round(self1 - self0, 2),
           "children": round(reaped1 - reaped0 - gone_before + live, 2), "live": round(live, 2),
           "procs": len(started), "py": sum(p["python"] for p in started), "tf": sum(p["tf"] for p in started),
           "left": [p["comm"] for k, p in after.items() if k not in before], "kinds": _kinds(started)}
    out = os.environ.get("CPU_PROFILE_DIR", "build/cpu-profile")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, os.environ.get("PYTEST_XDIST_WORKER", "main") + ".jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def report(folder: str, top: int = 40) -> str:
    """Files and tests of a profile folder by CPU seconds (self + children)."""
    rows = []
    for path in glob.glob(os.path.join(folder, "*.jsonl")):
        with open(path) as f:
            rows += [json.loads(line) for line in f]
    cpu = lambda r: r["self"] + r["children"]  # noqa: E731
    lines = [f"{len(rows)} tests: {sum(map(cpu, rows)):.0f} CPU-s (pytest {sum(r['self'] for r in rows):.0f}, "
             f"children {sum(r['children'] for r in rows):.0f}), {sum(r['tf'] for r in rows)} TensorFlow processes",
             "", "   CPU-s  wall-s  tests  TF  python  file"]
    files: dict[str, list] = collections.defaultdict(lambda: [0.0, 0.0, 0, 0, 0])
    for r in rows:
        f = files[r["id"].split("::")[0]]
        f[0] += cpu(r)
        f[1] += r["wall"]
        f[2] += 1
        f[3] += r["tf"]
        f[4] += r["py"]
    for name, (c, w, n, tf, py) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{c:8.1f} {w:7.1f} {n:6d} {tf:3d} {py:7d}  {name}")
    lines += ["", "   CPU-s (live)  wall-s  TF  test"]
    for r in sorted(rows, key=lambda r: -cpu(r))[:top]:
        mark = "" if r.get("outcome", "passed") == "passed" else f"  [{r['outcome']}]"
        lines.append(f"{cpu(r):8.1f} ({r['live']:5.1f}) {r['wall']:7.1f} {r['tf']:3d}  {r['id']}{mark}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40))
