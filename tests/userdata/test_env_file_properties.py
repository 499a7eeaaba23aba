"""Property test of the machine's env file: any value the stack renders reaches the trainer unchanged.

The path a value takes: `components.userdata.render_env` writes `/etc/trainstack/env`; the
boot scripts read it (`lib.sh` `load_env`: `set -a; . "$ENV_FILE"`); `supervise.sh`'s
`write_container_env` writes the shell's values one per line for `docker run --env-file`;
docker reads that file line by line; the trainer's config (`trainer.config.load_config`)
reads the container's environment. A value that the renderer accepts and any later step
changes (a quote, a `$`, a backslash, a leading dash, a trailing carriage return) would
reach the trainer as something else, or stop it from starting. The real `lib.sh` and the
real `write_container_env` run here, in bash; docker's reading is the documented rule.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from components.settings import ConfigError
from components.userdata import boot_env, render_env
from devtools.sandbox import settings_for
from tests.userdata.helpers import docker_env_file, through_the_machine
from trainer.config import load_config

# Any text a value may hold: the renderer refuses what an env file line cannot carry.
VALUES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)

BASE = boot_env(settings_for("aws"), run_uri="s3://trainstack-test/runs/r", group="trainstack-sandbox-gpu",
                code_uri="")


@given(VALUES)
@example("spot estimate, price table 2026-06-01")
@example("it's $HOME `date` \\ \"quoted\"")
@example("-0.5 a note starting with a dash")
@example("-x")
@example("ends with a carriage return\r")
@example("  padded  ")
def test_any_rendered_value_reaches_the_trainer_unchanged(value):
    # TRAINSTACK_PRICE_NOTE is free text the stack writes (the price table's note) and the
    # trainer keeps as it is (--price-note): what arrives is exactly what was rendered.
    env = {**BASE, "TRAINSTACK_PRICE_NOTE": value}
    try:
        render_env(env)
    except ValueError as e:
        # Refused at render time (before any machine starts) is fine, for what a line cannot carry.
        assert any(c in value for c in "\n\r\x00"), (value, e)
        return
    with tempfile.TemporaryDirectory() as tmp:
        container = through_the_machine(env, Path(tmp))
    assert container["TRAINSTACK_PRICE_NOTE"] == value
    cfg = load_config([], env=container)
    assert cfg.price_note == value
    assert cfg.run_uri == "s3://trainstack-test/runs/r" and cfg.synthetic


FREE_TEXT_FLAGS = st.sampled_from(["--price-note", "--work-dir"]).flatmap(lambda f: VALUES.map(lambda v: f"{f}={v}"))


@given(st.lists(st.sampled_from(["--price-note=spot estimate", "--work-dir=/data/my work", "--learning-rate=0.01",
                                 "--price-note=it's", "--seed=7", "--price-note=$HOME"]) | FREE_TEXT_FLAGS,
                min_size=1, max_size=3))
@example(["--price-note=two\nlines"])
def test_extra_args_with_spaces_and_quotes_reach_the_trainer_as_given(args):
    """run.extraArgs travel shell-quoted in one variable (TRAINSTACK_EXTRA_ARGS): the quoting must
    survive the env file, and the trainer must split them back into the same flags. What cannot
    travel is refused by the stack's config, before anything is created."""
    try:
        settings = settings_for("aws", extraArgs=list(args))
    except ConfigError as e:
        assert e.key.startswith("run.extraArgs") and any(c in "".join(args) for c in "\n\r\x00"), e
        return
    env = boot_env(settings, run_uri="s3://trainstack-test/runs/r", group="trainstack-sandbox-gpu", code_uri="")
    with tempfile.TemporaryDirectory() as tmp:
        container = through_the_machine(env, Path(tmp))
    assert shlex.split(container["TRAINSTACK_EXTRA_ARGS"]) == list(args)
    cfg = load_config([], env=container)
    last = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args}
    if "--price-note" in last:
        assert cfg.price_note == last["--price-note"]
    if "--work-dir" in last:
        assert cfg.work_dir == last["--work-dir"]


def test_the_docker_reading_used_here_is_dockers():
    """The rule above against the cases docker's own tests spell out (opts/envfile_test.go)."""
    assert docker_env_file(b"# comment\n\n  FOO=bar baz \nEMPTY=\nEQ=a=b\r\n") == {
        "FOO": "bar baz ", "EMPTY": "", "EQ": "a=b"}


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
