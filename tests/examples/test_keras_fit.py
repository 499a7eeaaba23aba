"""The worked example `examples/keras-fit`: the seed article's script with the guide's diff applied.

docs/your-fit-script.md gives the diff a user applies to their own script; the example is the
seed article's script (bench/seed_train.py, the reference peer) with that diff. Each removed
line is the seed's and gone from the example, each added line is in the example, and the
three helper calls are the ones the guide's table explains. Training it is test_fit.py's.
"""

from __future__ import annotations

import re

from tests.trainer.helpers import REPO

GUIDE = REPO / "docs" / "your-fit-script.md"
SEED = REPO / "bench" / "seed_train.py"
EXAMPLE = REPO / "examples" / "keras-fit" / "train.py"


def _diff() -> tuple[list[str], list[str]]:
    block = re.search(r"```diff\n(.*?)```", GUIDE.read_text(), re.S)
    assert block, "docs/your-fit-script.md has no diff block"
    lines = block.group(1).splitlines()
    removed = [ln[1:].strip() for ln in lines if ln.startswith("-") and ln[1:].strip()]
    added = [ln[1:].strip() for ln in lines if ln.startswith("+") and ln[1:].strip()]
    return removed, added


def _code_lines(path) -> list[str]:
    # A line's code, without its trailing comment and indentation: the guide's lines are unindented.
    return [re.sub(r"\s+#.*$", "", ln).strip() for ln in path.read_text().splitlines()]


def _contains(lines: list[str], wanted: str) -> bool:
    # The seed keeps fit's history (`history = model.fit(...)`): a line may be an assignment's right side.
    return any(ln == wanted or ln.endswith(f"= {wanted}") for ln in lines)


def test_the_example_is_the_seed_script_with_the_guides_diff():
    removed, added = _diff()
    seed, example = _code_lines(SEED), _code_lines(EXAMPLE)
    assert len(removed) >= 4 and len(added) >= 4, (removed, added)
    missing_in_seed = [ln for ln in removed if not _contains(seed, ln)]
    assert not missing_in_seed, f"the guide removes lines the seed script does not have: {missing_in_seed}"
    still_in_example = [ln for ln in removed if _contains(example, ln)]
    assert not still_in_example, f"the example keeps lines the guide removes: {still_in_example}"
    missing_in_example = [ln for ln in added if not _contains(example, ln)]
    assert not missing_in_example, f"the example lacks lines the guide adds: {missing_in_example}"


def test_the_diff_makes_the_three_helper_calls_the_guide_explains():
    _, added = _diff()
    text = "\n".join(added)
    assert "from trainer import fit" in text
    calls = sorted(set(re.findall(r"\bfit\.(\w+)\(", text)))
    assert calls == ["callbacks", "model_dir", "strategy"], calls
    table = GUIDE.read_text()
    assert all(f"| `fit.{c}()` |" in table for c in calls)


def test_the_guides_send_several_machines_to_keras_2():
    # A script on several machines needs Keras 2 (the stack refuses run.command with nodes > 1 and
    # run.keras 3, test_settings_command.py): the fit guide and the several-machines guide both say
    # why and what to set.
    checked = []
    for guide in (GUIDE, REPO / "docs" / "multinode.md"):
        text = guide.read_text()
        assert "keras-team/keras#20585" in text and "run.keras: 2" in text and "run.command" in text, guide
        checked.append(guide.name)
    assert checked == ["your-fit-script.md", "multinode.md"]
