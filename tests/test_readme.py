"""The stack keys page (docs/configuration.md) names every stack key and no key that does not exist; the
README starts with the two commands."""

import re
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


def test_readme_first_command_is_the_local_trainer():
    text = README.read_text()
    assert "python -m trainer --run-uri file://./runs/demo --synthetic" in text
    assert "python -m pytest" in text
    assert "python -m pytest" in (README.parent / ".ci" / "run").read_text()


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    assert text.split("\n## ", 2)[1].startswith("The two commands")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert [b.strip() for b in blocks[:2]] == ["python -m trainer --run-uri file://./runs/demo --synthetic",
                                               "python -m pytest"]
