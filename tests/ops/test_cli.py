"""`python -m ops` command-line mistakes: one line naming the nearest command or flag, exit 2."""

from __future__ import annotations

import pytest

from ops.__main__ import main


@pytest.mark.parametrize(("argv", "line"), [
    (["sytnh", "--stack", "dev"], "python -m ops: error: unknown command 'sytnh' (did you mean synth?); commands: "),
    (["tunnel", "--host", "127.0.0.1", "--jupiter"],
     "python -m ops tunnel: error: unknown option --jupiter (did you mean --jupyter?); see python -m ops tunnel --help"),
    (["status", "--stack", "dev", "--wacth"], "python -m ops status: error: unknown option --wacth (did you mean --watch?)"),
    (["runs", "--stack", "dev", "stray"], "python -m ops runs: error: unexpected argument 'stray'"),
    (["status", "--stack"], "python -m ops status: error: argument --stack: expected one argument"),
])
def test_a_mistake_is_one_line_with_the_nearest_real_name(capsys, argv, line):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and len(err.strip().splitlines()) == 1, err


def _bare_exit_numbers() -> list[str]:
    """Every `return <int>` and `exit(<int>)` / `sys.exit(<int>)` in ops/: an exit status without its name."""
    import ast
    from pathlib import Path

    import ops

    found = []
    for path in sorted(Path(ops.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Return):
                value = node.value
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "exit":
                value = node.args[0] if node.args else None
            else:
                continue
            if isinstance(value, ast.Constant) and type(value.value) is int:
                found.append(f"{path.name}:{node.lineno}: {value.value}")
    return found


def test_no_command_returns_a_bare_exit_number():
    from ops import cli

    assert _bare_exit_numbers() == []
    assert (cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_ERROR, cli.EXIT_STALLED, cli.EXIT_INTERRUPTED) == (0, 1, 2, 3, 130)


def test_the_check_for_bare_exit_numbers_finds_one(tmp_path, monkeypatch):
    import ops

    (tmp_path / "bad.py").write_text("import sys\ndef f():\n    return 2\ndef g():\n    sys.exit(1)\n")
    monkeypatch.setattr(ops, "__file__", str(tmp_path / "__init__.py"))
    assert _bare_exit_numbers() == ["bad.py:3: 2", "bad.py:5: 1"]


@pytest.mark.parametrize(("any_free", "text", "port"), [
    (False, "1", 1), (False, "65535", 65535), (False, "0", None), (False, "65536", None), (False, "x", None),
    (True, "0", 0), (True, "8888", 8888), (True, "-1", None), (True, "", None),
])
def test_port_type(any_free, text, port):
    import argparse

    from ops.cli import port_type

    parse = port_type(any_free=any_free)
    if port is None:
        with pytest.raises(argparse.ArgumentTypeError, match="expected a local port"):
            parse(text)
    else:
        assert parse(text) == port


def test_the_project_root_is_the_folder_with_pulumi_yaml():
    from components import project

    assert project.PULUMI_YAML.is_file() and project.PROGRAM.is_file() and project.STACKS_DIR.is_dir()
    assert (project.USERDATA_DIR / "lib.sh").is_file() and (project.RUNFOLDER_DIR / "layout.py").is_file()


@pytest.mark.parametrize(("kind", "text", "value", "error"), [
    ("positive_float", "1.5", 1.5, None), ("positive_float", "0", None, "'0': must be more than 0"),
    ("positive_float", "nan", None, "must be more than 0"), ("positive_float", "x", None, "'x' is not a number"),
    ("non_negative_int", "0", 0, None), ("non_negative_int", "-1", None, "'-1': must be 0 or more"),
    ("non_negative_int", "1.5", None, "'1.5' is not a whole number"),
])
def test_number_types(kind, text, value, error):
    import argparse

    from ops import cli

    parse = getattr(cli, kind)
    if error is None:
        assert parse(text) == value
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=error):
            parse(text)
