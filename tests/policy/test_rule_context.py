"""The rules' context as the policy pack reads it from the raw stack config (no pydantic): camelCase
or snake_case keys, the shared defaults when a key or block is absent, and the same context the
program gets from its validated settings."""

from __future__ import annotations

import pytest

from components import config_shared
from components.settings import load_settings
from policy.rules import Context, context_from_config, context_from_settings

BASE = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True}}


def test_absent_keys_and_blocks_take_the_shared_defaults():
    assert context_from_config({}, "dev") == Context(
        allowed_ssh_cidrs=tuple(config_shared.DEFAULT_ALLOWED_CIDRS), on_demand=not config_shared.DEFAULT_SPOT,
        keep_bucket=config_shared.DEFAULT_KEEP_ON_DESTROY, stack="dev", run_id="dev")
    # A block that is not a mapping, or a null value, reads as absent.
    assert context_from_config({"run": "x", "compute": {"spot": None}, "storage": ["y"], "access": None}, "dev") == (
        context_from_config({}, "dev"))


@pytest.mark.parametrize("style", ["camel", "snake"])
def test_each_value_is_read_in_either_spelling(style):
    def k(camel: str, snake: str) -> str:
        return camel if style == "camel" else snake

    raw = {"run": {"id": "exp-7"}, "compute": {"spot": False},
           "storage": {k("keepOnDestroy", "keep_on_destroy"): False},
           "access": {k("allowedCidrs", "allowed_cidrs"): ["203.0.113.0/24", "198.51.100.7/32"]}}
    assert context_from_config(raw, "prod") == Context(
        allowed_ssh_cidrs=("203.0.113.0/24", "198.51.100.7/32"), on_demand=True, keep_bucket=False, stack="prod",
        run_id="exp-7")


def test_only_an_explicit_false_changes_spot_and_the_kept_bucket():
    raw = {"compute": {"spot": True}, "storage": {"keepOnDestroy": True}}
    ctx = context_from_config(raw, "dev")
    assert (ctx.on_demand, ctx.keep_bucket) == (False, True)


@pytest.mark.parametrize("blocks", [
    {},
    {"compute": {"spot": False, "instanceTypes": ["g5.xlarge"]}, "storage": {"keepOnDestroy": False}},
    {"run": {"synthetic": True, "id": "exp-7"},
     "access": {"allowedCidrs": ["203.0.113.0/24"], "sshPublicKey": None}},
])
def test_the_pack_and_the_program_agree_on_the_context(blocks):
    raw = {**BASE, **blocks}
    if raw.get("access", {}).get("sshPublicKey", 0) is None:
        from tests.components.test_settings import KEY
        raw["access"] = {**raw["access"], "sshPublicKey": KEY}
    assert context_from_config(raw, "dev") == context_from_settings(load_settings(raw, stack="dev"))


# -- the helpers every rule reads resources with --


def test_get_follows_list_indexes_only_within_the_list():
    from policy.rules import base

    r = {"inputs": {"a": [5], "n": 1}}
    assert (base.get(r, "a.0"), base.get(r, "a.1", "d"), base.get(r, "n.0", "d")) == (5, "d", "d")


def test_the_keys_a_resource_is_pointed_at_by():
    from policy.rules import base

    r = {"name": "n", "id": "i", "inputs": {"bucket": "b"}, "outputs": {"bucket": "o"}}
    assert base.keys_of(r, "bucket") == {"n", "i", "b", "o"}
    assert base.keys_of({"name": "", "id": base.UNKNOWN, "inputs": {"bucket": 3}}, "bucket") == set()


def test_a_child_links_to_its_owner_by_reference_or_as_its_only_sibling():
    from policy.rules import base

    a = {"name": "a", "parent": "p", "inputs": {"bucket": "bucket-a"}}
    b = {"name": "b", "parent": "q", "inputs": {"bucket": "bucket-b"}}
    # A reference to another owner's bucket is that owner's, even beside a lone sibling.
    child = {"name": "c", "parent": "p", "inputs": {"bucket": "bucket-b"}}
    assert not base.linked(child, a, "bucket", ("bucket",), [a, b], engine_ids=True)
    # An unreadable reference links by parent only: the same one, and not none.
    orphan = {"name": "c", "parent": None, "inputs": {"bucket": base.UNKNOWN}}
    lone = {"name": "l", "parent": None, "inputs": {}}
    assert not base.linked(orphan, lone, "bucket", ("bucket",), [lone])
    elsewhere = {"name": "c", "parent": "x", "inputs": {"bucket": base.UNKNOWN}}
    assert not base.linked(elsewhere, b, "bucket", ("bucket",), [b])
    assert base.linked({**elsewhere, "parent": "q"}, b, "bucket", ("bucket",), [b])
