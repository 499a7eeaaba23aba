"""The project's modules import one another without a circle, and each floor imports only the floors below it.

A circle (a imports b, b imports a, however deep inside a function) means neither module can be
understood, tested or moved without the other; the layers stay a ladder only if none exists.
The floors (docs/architecture.md draws them): runfolder/ at the bottom imports no project package;
trainer/, schedulers/, controller/, components/ and ops/ stand on it, and the last three never import the
trainer, except where LAYER_EXCEPTIONS says why. Function-local imports count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "components", "controller", "devtools", "examples", "ops", "policy", "runfolder", "schedulers",
            "simworld", "trainer", "userdata")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Each project module -> the project modules it imports (anywhere in its file)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from pkg import mod` imports pkg.mod when it is a module, else a name of pkg.
                deps |= {resolve(f"{node.module}.{a.name}") for a in node.names}
        graph[name] = deps - {None, name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_function_local_imports():
    graph = import_graph()
    assert "trainer.staging" in graph["trainer.data"]  # the stream stages its files
    assert "runfolder.storage" in graph["trainer.staging"]  # imported inside its functions


def test_no_project_module_imports_itself_back_through_others():
    found = circles(import_graph())
    assert found == [], "import circles (break each by moving the shared piece down a floor): " + "; ".join(
        " <-> ".join(group) for group in found)


# Package -> the project packages it must never import.
FORBIDDEN = {
    "runfolder": set(PACKAGES) - {"runfolder"},
    "controller": {"trainer", "components", "ops", "simworld"},
    # A scheduler's room stands on the run folder alone: ops and the controller both call it.
    "schedulers": {"trainer", "components", "controller", "ops"},
    # The simulated world stands on the controller, the run folder and the trainer's commit protocol; nothing the
    # stack deploys or the operator runs imports it (the replay's command line alone, below).
    "components": {"trainer", "simworld"},
    "ops": {"trainer", "simworld"},
}
# (importer, imported) -> why this one import crosses the floors.
LAYER_EXCEPTIONS = {
    ("controller.replay", "simworld.replay"): "`python -m controller.replay` is the replay's command line under the "
                                              "controller's name; the function package leaves the file out",
    ("components.settings.common", "trainer.config"): "a stack's run options are checked with the trainer's own "
                                                      "command-line parser, so the stack refuses what the trainer would",
    ("components.settings.schema", "trainer.config"): "the stack's run block is the trainer's TrainConfig",
    ("components.settings.usercode", "trainer.config"): "a run.command is checked as the trainer checks it",
}


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The (importer, imported) pairs where a package imports a floor FORBIDDEN to it, not excepted."""
    found = []
    for name, deps in sorted(graph.items()):
        forbidden = FORBIDDEN.get(name.split(".")[0], set())
        found += [(name, dep) for dep in sorted(deps)
                  if dep.split(".")[0] in forbidden and (name, dep) not in LAYER_EXCEPTIONS]
    return found


def test_the_layer_check_finds_a_planted_crossing():
    graph = {"runfolder.layout": {"trainer.loop"}, "ops.status": {"runfolder.layout", "trainer.checkpoint_store"},
             "components.settings.schema": {"trainer.config"}, "trainer.loop": {"runfolder.layout"}}
    assert layer_violations(graph) == [("ops.status", "trainer.checkpoint_store"), ("runfolder.layout", "trainer.loop")]


def test_each_floor_imports_only_the_floors_below_it():
    graph = import_graph()
    assert graph["controller.tick"] & {"runfolder.lease", "runfolder.storage"}  # the graph sees the ground floor
    found = layer_violations(graph)
    assert found == [], "imports across the floors (move the shared piece into runfolder/, or add a reasoned " \
        "exception to LAYER_EXCEPTIONS): " + "; ".join(f"{a} -> {b}" for a, b in found)


def test_every_layer_exception_is_still_an_import():
    graph = import_graph()
    stale = [pair for pair in LAYER_EXCEPTIONS if pair[1] not in graph.get(pair[0], set())]
    assert stale == [], f"exceptions no module needs any more (remove them): {stale}"


# Each cloud's package builds its own cloud only: what spans clouds (the placement list, federation across them)
# lives one floor up, in components/multicloud/ and components/placement.py, and calls each cloud's package.
CLOUD_PACKAGES = ("components.aws", "components.gcp")
ABOVE_THE_CLOUDS = ("components.placement", "components.multicloud")


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """`module -> import` for each import of a cloud package's module into the other cloud or the floor above."""
    found = []
    for module, deps in sorted(graph.items()):
        own = next((p for p in CLOUD_PACKAGES if module == p or module.startswith(p + ".")), None)
        if own is None:
            continue
        forbidden = [p for p in CLOUD_PACKAGES if p != own] + list(ABOVE_THE_CLOUDS)
        found += [f"{module} -> {d}" for d in sorted(deps)
                  if any(d == f or d.startswith(f + ".") for f in forbidden)]
    return found


def test_the_crossing_finder_finds_a_planted_crossing():
    graph = {"components.aws.stack": {"components.gcp.naming", "components.common"},
             "components.gcp.group": {"components.placement"}, "components.multicloud": {"components.aws.group"},
             "components.awsx": {"components.gcp"}}
    assert crossings(graph) == ["components.aws.stack -> components.gcp.naming",
                                "components.gcp.group -> components.placement"]


def test_neither_cloud_package_imports_the_other_or_the_floor_above():
    graph = import_graph()
    assert "components.aws.group" in graph["components.multicloud.aws_placements"]  # the graph sees the layer
    found = crossings(graph)
    assert found == [], ("a cloud package imports across clouds (move what spans clouds to components/multicloud/, "
                         "which calls each cloud's package): " + "; ".join(found))
