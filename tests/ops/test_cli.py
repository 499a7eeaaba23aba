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
