"""The stack keys page (docs/configuration.md) names every stack key and no key that does not exist; the
README starts with the two commands."""

import re
import shlex
from pathlib import Path

from components import settings as st

README = Path(__file__).resolve().parent.parent / "README.md"
KEYS_PAGE = README.parent / "docs" / "configuration.md"
BLOCK_MODELS = {
    "run": st.RunSettings,
    "compute": st.ComputeSettings,
    "image": st.ImageSettings,
    "storage": st.StorageSettings,
    "access": st.AccessSettings,
    "placement": st.PlacementPolicySettings,
    "kubernetes": st.KubernetesSettings,
    "serve": st.ServeSettings,
}
# Lists of blocks: each entry's keys, written `placements[].region`.
LIST_MODELS = {"placements": st.PlacementSettings}


def _model_keys() -> set[str]:
    keys = {f"trainstack:{k}" for k in st.SCALARS}
    assert set(BLOCK_MODELS) == set(st.BLOCKS) and set(LIST_MODELS) == set(st.LISTS)
    for block, model in BLOCK_MODELS.items():
        keys |= {f"{block}.{f.alias}" for f in model.model_fields.values()}
    for block, model in LIST_MODELS.items():
        keys |= {f"{block}[].{f.alias}" for f in model.model_fields.values()}
    return keys


def _readme_keys() -> set[str]:
    text = KEYS_PAGE.read_text()
    table = text.split("| key | default | meaning |", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.M))


def test_config_reference_matches_settings():
    model, readme = _model_keys(), _readme_keys()
    assert len(model) > 30
    assert model - readme == set(), "keys missing from docs/configuration.md"
    assert readme - model == set(), "docs/configuration.md documents keys that do not exist"


DEMO = "bash .ci/setup && .venv/bin/python -m trainer --run-uri file://./runs/demo --model digits"
TESTS = "bash .ci/run"


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    assert text.split("\n## ", 2)[1].startswith("The two commands")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert [b.strip() for b in blocks[:2]] == [DEMO, TESTS]


def test_each_command_sets_itself_up():
    ci_run = (README.parent / ".ci" / "run").read_text()
    # The tests' command runs the set-up, then the linter and the suite.
    assert ci_run.index("bash .ci/setup") < ci_run.index("ruff check .") < ci_run.index("python -m pytest")
    assert DEMO.startswith("bash .ci/setup && .venv/bin/python ")  # the demo's interpreter is the one set up
    setup = (README.parent / ".ci" / "setup").read_text()
    assert "-r requirements-dev.txt" in setup


def test_the_demo_command_is_a_valid_trainer_command_with_its_data_in_the_checkout():
    from trainer.config import load_config

    args = shlex.split(DEMO.split(" -m trainer ", 1)[1])
    cfg = load_config(args)
    assert cfg.model == "digits" and not cfg.synthetic and cfg.data_uri is None
    # The digits are in the checkout (no package to install): every class, the held-out fifth apart.
    from trainer.data import DIGITS_VALIDATION, uci_digits

    (x, y), (x_held, y_held) = uci_digits()
    assert x.shape == (1797 - DIGITS_VALIDATION, 64) and x_held.shape == (DIGITS_VALIDATION, 64)
    assert set(y.tolist()) == set(y_held.tolist()) == set(range(10)) and 0.0 <= x.min() < x.max() <= 1.0
