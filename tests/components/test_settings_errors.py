"""How pydantic's errors become one line naming the key (components/settings/errors.py): through the
stack's own schema where a user can reach the case, and on small models for the cases the schema
has no field for yet (a `lt` bound, a nested block in a list, a block in a dict)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from components.settings import ConfigError, load_settings
from components.settings.errors import closest, keyed, one_line

BASE = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True}}


def _refused(**blocks) -> str:
    raw = {**BASE, **blocks}
    with pytest.raises(ConfigError) as e:
        load_settings(raw, stack="dev")
    return str(e.value)


# -- through the stack's schema --


@pytest.mark.parametrize(("blocks", "line"), [
    ({"run": {"synthetic": True, "steps": [5]}}, "trainstack:run.steps: [5]: expected a whole number, e.g. 4"),
    ({"compute": {"maxRuntimeHours": "long"}}, "trainstack:compute.maxRuntimeHours: 'long': expected a number, e.g. 1.5"),
    ({"compute": {"maxRuntimeHours": [2]}}, "trainstack:compute.maxRuntimeHours: [2]: expected a number, e.g. 1.5"),
    ({"run": {"synthetic": [True]}}, "trainstack:run.synthetic: [True]: expected true or false"),
    ({"run": {"synthetic": True, "model": ["mlp"]}}, "trainstack:run.model: ['mlp']: expected text"),
    # A block where a number goes is shown as a block, not spelled out.
    ({"run": {"synthetic": True, "steps": {"max": 5}}}, "trainstack:run.steps: {…}: expected a whole number, e.g. 4"),
])
def test_each_kind_of_wrong_value_says_what_to_write(blocks, line):
    assert _refused(**blocks) == line


def test_a_value_is_shown_whole_up_to_80_characters():
    exact = "x" * 78  # its repr is 80 characters
    assert _refused(run={"synthetic": True, "model": exact}).startswith(f"trainstack:run.model: '{exact}': expected")
    longer = "x" * 79
    assert _refused(run={"synthetic": True, "model": longer}).startswith(
        f"trainstack:run.model: '{longer[:76]}…: expected")


def test_a_mistyped_required_key_is_said_as_unknown_not_missing():
    # The placement lacks instanceTypes and has instanceType: the typo is what to fix.
    home = {"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]}
    west = {"cloud": "aws", "region": "us-west-2", "instanceType": ["g5.xlarge"]}
    assert _refused(placements=[home, west]) == ("trainstack:placements[1].instanceType: unknown key; did you mean "
                                                 "'instanceTypes'?")


def test_an_unknown_key_like_no_other_lists_the_blocks_keys():
    line = _refused(run={"synthetic": True, "zzzzzz": 1})
    assert line.startswith("trainstack:run.zzzzzz: unknown key; expected one of: id, model, code, command, keras, synthetic, "
                           "dataUri, "), line


@pytest.mark.parametrize("key", ["aws:region", "team:ml.owner"])
def test_a_block_key_that_looks_namespaced_is_still_the_stacks(key):
    # Only a top-level key of another namespace (aws:secretKey) is shown as it is.
    assert _refused(run={"synthetic": True, key: 1}).startswith(f"trainstack:run.{key}: unknown key; ")


# -- on small models: the cases the schema has no field for yet --


class Leaf(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alpha: int = 0
    beta: int = 0


class Middle(BaseModel):
    model_config = ConfigDict(extra="forbid")
    leaf: Leaf = Leaf()
    gamma: int = 0


class Root(BaseModel):
    model_config = ConfigDict(extra="forbid")
    middle: Middle = Middle()
    many: list[Middle] = []
    maybe: Leaf | None = None
    named: dict[str, Leaf] = {}
    below: int = Field(0, lt=10)
    pair: list[int] = Field([1, 2], min_length=2)
    table: dict[str, int] = {}

    @model_validator(mode="after")
    def _not_both(self):
        if self.below == 7 and self.gamma_total() == 7:
            raise keyed("below", "cannot be 7 while the middles add up to 7")
        if self.below == 3:
            raise ValueError("three is not allowed here")
        return self

    def gamma_total(self) -> int:
        return self.middle.gamma + sum(m.gamma for m in self.many)


def _line(doc: dict) -> str:
    with pytest.raises(ValidationError) as e:
        Root.model_validate(doc)
    return str(one_line(e.value, Root))


@pytest.mark.parametrize(("doc", "line"), [
    ({"middle": {"leaf": {"alpah": 1}}}, "trainstack:middle.leaf.alpah: unknown key; did you mean 'alpha'?"),
    ({"many": [{}, {"leaf": {"btea": 1}}]}, "trainstack:many[1].leaf.btea: unknown key; did you mean 'beta'?"),
    ({"many": [{"gamam": 1}]}, "trainstack:many[0].gamam: unknown key; did you mean 'gamma'?"),
    ({"maybe": {"alpah": 1}}, "trainstack:maybe.alpah: unknown key; did you mean 'alpha'?"),
])
def test_an_unknown_key_is_matched_against_its_own_block(doc, line):
    assert _line(doc) == line


def test_an_unknown_key_in_a_block_of_a_dict_is_still_one_line():
    assert _line({"named": {"k": {"btea": 1}}}).startswith("trainstack:named.k.btea: unknown key; ")


@pytest.mark.parametrize(("doc", "line"), [
    ({"below": 30}, "trainstack:below: 30: expected less than 10"),
    ({"pair": [1]}, "trainstack:pair: [1]: expected at least 2 entries; remove the key for the default"),
    ({"table": "x"}, "trainstack:table: 'x': expected a block of keys"),
    ({"below": 7, "middle": {"gamma": 7}}, "trainstack:below: 7: cannot be 7 while the middles add up to 7"),
    ({"below": 3}, "trainstack:config: {…}: three is not allowed here"),
])
def test_a_bound_a_length_a_block_and_a_whole_model_check(doc, line):
    assert _line(doc) == line


def test_an_object_where_a_block_goes_is_a_block_of_keys():
    err = ValidationError.from_exception_data("Root", [{"type": "model_attributes_type", "loc": ("middle",), "input": 3}])
    assert str(one_line(err, Root)) == "trainstack:middle: 3: expected a block of keys"


def test_did_you_mean_prefers_swapped_letters_among_the_three_closest_only():
    assert closest("placemenst", ["placement", "placements"]) == "placements"
    # The swapped-letters key ranks fourth: a much closer key wins.
    assert closest("abcdef", ["abcdefx", "abcdefy", "abcdefz", "abcdfe"]) in {"abcdefx", "abcdefy", "abcdefz"}
    assert closest("zzzz", ["alpha", "beta"]) is None
