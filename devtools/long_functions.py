"""Functions over 80 lines outside tests/: `python -m devtools.long_functions` lists them, longest first.

A function that long usually does several jobs; the few that read top to bottom (a declarative
list of resources) say so on the line above their `def`, as `# long function: <why>`, and are
listed apart. tests/devtools/test_long_functions.py keeps the count from growing.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80
SKIPPED = {"tests", ".venv", ".venv-policy", "build", "runs", "node_modules", ".git"}
REASON = "# long function:"


@dataclass(frozen=True)
class Long:
    """One function over the limit: where, how long, and its stated reason (empty when none)."""

    path: str
    line: int
    name: str
    lines: int
    reason: str


def python_files(root: Path = ROOT) -> list[Path]:
    """The project's Python files outside tests/ and the environments."""
    return sorted(p for p in root.rglob("*.py")
                  if not SKIPPED & set(p.relative_to(root).parts) and "__pycache__" not in p.parts)


def long_functions(path: Path, root: Path = ROOT, limit: int = LIMIT) -> list[Long]:
    """The functions (methods and nested ones included) of `path` longer than `limit` lines."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                above = lines[first - 2].strip() if first >= 2 else ""
                reason = above[len(REASON):].strip() if above.startswith(REASON) else ""
                found.append(Long(str(path.relative_to(root)), node.lineno, node.name, length, reason))
    return found


def survey(root: Path = ROOT, limit: int = LIMIT) -> list[Long]:
    """Every function over `limit` lines in the project outside tests/, longest first."""
    found = [f for p in python_files(root) for f in long_functions(p, root, limit)]
    return sorted(found, key=lambda f: (-f.lines, f.path, f.line))


def main() -> int:
    """Print the long functions; exit 0 (a survey, not a gate: the test is the gate)."""
    found = survey()
    for f in found:
        print(f"{f.lines:4d}  {f.path}:{f.line}  {f.name}" + (f"  ({f.reason})" if f.reason else ""))
    unexplained = [f for f in found if not f.reason]
    print(f"{len(found)} functions over {LIMIT} lines outside tests/, {len(unexplained)} without a reason")
    return 0


if __name__ == "__main__":
    sys.exit(main())
