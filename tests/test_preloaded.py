"""The tests' preloaded `python -m` (tests/helpers/preloaded.py) behaves as a fresh interpreter: same output and exit
status, the caller's environment and working directory, a silent hang stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.commands import run_command, run_commands

COMMANDS = [["-m", "vitsinks"], ["-m", "vitsinks.launch", "train.batch_size=many"],
            ["-m", "vitsinks.leaderboard", "rns=x"]]


def _both(commands: list[list[str]], monkeypatch: pytest.MonkeyPatch, **kwargs) -> tuple[list, list]:
    preloaded = run_commands(commands, **kwargs)
    with monkeypatch.context() as m:
        m.setenv("VITSINKS_TEST_FRESH", "1")
        fresh = run_commands(commands, **kwargs)
    return preloaded, fresh


@pytest.mark.slow
def test_a_preloaded_command_prints_and_exits_as_a_fresh_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    preloaded, fresh = _both([[sys.executable, *c] for c in COMMANDS], monkeypatch)
    for a, b in zip(preloaded, fresh, strict=True):
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    assert [p.returncode for p in preloaded] == [0, 1, 1] and "vitsinks.launch" in preloaded[0].stdout


@pytest.mark.slow
def test_the_callers_environment_and_folder_reach_the_command(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    bad = [sys.executable, "-m", "vitsinks.launch", "train.batch_size=many"]
    quiet, loud = run_command(bad), run_command(bad, env={**os.environ, "VITSINKS_TRACEBACK": "1"})
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr and "Traceback" in loud.stderr
    (tmp_path / "where_am_i.py").write_text("import os, sys\nprint(os.getcwd(), __name__, sys.argv[1:])\n")
    preloaded, fresh = _both([[sys.executable, "-m", "where_am_i", "a=1"]], monkeypatch, cwd=tmp_path)
    assert preloaded[0].stdout == fresh[0].stdout == f"{tmp_path} __main__ ['a=1']\n"  # found on the path there


@pytest.mark.slow  # the first preloaded command starts the server (its imports, ~10 s)
def test_a_silent_command_is_stopped_after_idle_s() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_command([sys.executable, "-m", "timeit", "-n", "1", "import time; time.sleep(60)"], idle_s=1)
