"""Compiles the bytecode of an environment's site-packages, less the provider modules the project never imports.

Run as `.venv/bin/python .ci/compile.py` after the install. The machines set PYTHONDONTWRITEBYTECODE, so what is
not compiled here is compiled again by every process that imports it. The Pulumi provider SDKs are half
of the environment's sources (pulumi_aws and pulumi_gcp: 200 MB in 4,500 files, 19 CPU-s of compiling), and a
program imports only the services it names (`aws.ec2`, `gcp.compute`: each a subpackage loaded on first use).
So their subpackages are compiled only where the project's sources name them; the rest of site-packages is
compiled whole but for what nothing here imports (`NEVER`). A service named later and missed here is still
imported, only compiled on the way.

A stamp in the environment (the hash of the requirements and of the project's sources that name services)
skips a second compile of the same environment: walking 23,000 files again took 11 CPU-s.

The project's own sources are compiled too, every time (an unchanged file is skipped by its timestamp): the tests
start several hundred Python processes that import them. And the test modules get the bytecode pytest itself
would cache, with their asserts rewritten: with PYTHONDONTWRITEBYTECODE set pytest caches nothing, so each of the
suite's workers rewrote all 260 test modules (7 CPU-s each, tests/README.md).
"""

from __future__ import annotations

import compileall
import hashlib
import os
import re
import sys
import sysconfig
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROVIDERS = {"pulumi_aws": ("aws", "pulumi_aws"), "pulumi_gcp": ("gcp", "pulumi_gcp"),
             "pulumi_kubernetes": ("k8s", "kubernetes", "pulumi_kubernetes")}
# Subpackages the named ones import themselves (every Kubernetes kind's metadata is `meta.v1`'s).
ALWAYS = {"__pycache__", "_utilities", "config", "meta"}
# Never imported by the project, its tests or its tools: the packages' own test suites, and cfn-lint with what only
# it needs (moto imports it for CloudFormation's template validation, which no test calls): 60 MB of sources.
NEVER = ("/tests/", "/cfnlint/", "/sympy/", "/mpmath/", "/networkx/")
SOURCES = ("components", "controller", "ops", "schedulers", "tests", "devtools", "bench", "policy", "__main__.py")


def named_services() -> dict[str, set[str]]:
    """Each provider package's subpackages that the project's sources name (`aws.ec2.`, `pulumi_gcp.storage`)."""
    found: dict[str, set[str]] = {pkg: set() for pkg in PROVIDERS}
    pattern = {pkg: re.compile(rf"\b(?:{'|'.join(aliases)})\.([a-z][a-z0-9_]*)\b")
               for pkg, aliases in PROVIDERS.items()}
    for top in SOURCES:
        path = ROOT / top
        files = [path] if path.is_file() else path.rglob("*.py") if path.is_dir() else []
        for f in files:
            text = f.read_text(errors="replace")
            for pkg, rx in pattern.items():
                found[pkg].update(rx.findall(text))
    return found


# The project's Python, outside the environments and the build and run folders.
PROJECT = ("__main__.py", "bench", "components", "controller", "devtools", "examples", "ops", "policy", "runfolder",
           "schedulers", "simworld", "tests", "trainer", "userdata")


def project_sources() -> None:
    """Byte-compile the project's own modules in place (`__pycache__`, which git ignores). A file that does not
    compile is left to ruff and pytest, which name it; compileall prints it here."""
    for top in PROJECT:
        path = ROOT / top
        if path.is_file():
            compileall.compile_file(str(path), quiet=1)
        elif path.is_dir():
            compileall.compile_dir(str(path), quiet=1)


def _rewritten(paths: list[str]) -> int:
    # pytest's own rewrite and pyc writer (private, but pinned with pytest): the same file it would cache,
    # checked by the source's hash when a worker imports the module, so a stale one is rewritten, not used.
    from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc, _rewrite_test, _write_pyc, get_cache_dir

    class _State:  # what _write_pyc reports a failed write to
        @staticmethod
        def trace(message: str) -> None:
            print(f"pytest bytecode: {message}", file=sys.stderr)

    written = 0
    for name in paths:
        fn = Path(name)
        cache = get_cache_dir(fn)
        pyc = cache / (fn.name[:-3] + PYC_TAIL)
        if _read_pyc(fn, pyc) is not None:  # written before, for this source
            written += 1
            continue
        try:
            source_hash, code = _rewrite_test(fn, None)  # None: the ini's enable_assertion_pass_hook is off
        except SyntaxError as e:  # pytest reports it where it collects the module; the set-up goes on
            print(f"pytest bytecode: {e}", file=sys.stderr)
            written += 1
            continue
        cache.mkdir(exist_ok=True)
        written += _write_pyc(_State(), code, source_hash, pyc)
    return written


def test_modules() -> None:
    """Write pytest's bytecode of the modules it rewrites: test files, conftests, the `pytest_plugins` (one not
    written is rewritten by each worker, as before: slower, not wrong)."""
    tests = ROOT / "tests"
    files = sorted(str(f) for f in tests.rglob("*.py") if f.name.startswith("test_") or f.name == "conftest.py")
    files += sorted(str(f) for f in (tests / "fixtures").glob("*.py"))
    cores = max(1, os.cpu_count() or 1)
    with ProcessPoolExecutor(cores) as pool:
        written = sum(pool.map(_rewritten, [files[i::cores] for i in range(cores)]))
    if written < len(files):
        print(f"pytest bytecode: {len(files) - written} of {len(files)} test modules not written", file=sys.stderr)


def main() -> int:
    project_sources()
    test_modules()
    site = Path(sysconfig.get_paths()["purelib"])
    services = named_services()
    digest = hashlib.sha256(repr(sorted((k, sorted(v)) for k, v in services.items())).encode())
    for req in sorted(ROOT.glob("requirements*.txt")) + [ROOT / "trainer" / "requirements-keras2.txt", Path(__file__)]:
        digest.update(req.read_bytes())
    stamp = Path(sys.prefix) / ".trainstack-compiled"
    if stamp.is_file() and stamp.read_text() == digest.hexdigest():
        return 0
    skip = []
    for pkg, names in services.items():
        unused = sorted(p.name for p in (site / pkg).glob("*/") if p.is_dir() and p.name not in names
                        and p.name not in ALWAYS)
        skip += [re.escape(f"/{pkg}/{name}/") for name in unused]
    skip += [re.escape(path) for path in NEVER]
    rx = re.compile("|".join(skip)) if skip else None
    if not compileall.compile_dir(str(site), quiet=1, workers=0, rx=rx):
        return 1
    stamp.write_text(digest.hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main())
