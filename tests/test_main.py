"""`python -m vitsinks`: the commands, found in the source, one line each."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import run_command
from vitsinks.__main__ import commands


def test_commands_are_the_modules_that_run_as_main_with_their_docstring_line(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "tool").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The package."""\n')
    (pkg / "__main__.py").write_text('"""This listing."""\n')
    (pkg / "run.py").write_text('"""Run things.\n\nMore text.\n"""\n\nif __name__ == "__main__":\n    pass\n')
    (pkg / "library.py").write_text('"""Not a command."""\n\ndef f() -> None:\n    pass\n')
    (pkg / "tool" / "__init__.py").write_text('"""A tool package."""\n')
    (pkg / "tool" / "__main__.py").write_text('"""`python -m pkg.tool`."""\n')
    assert commands(pkg) == {"pkg.run": "Run things.", "pkg.tool": "A tool package."}


def test_python_m_vitsinks_lists_every_documented_command() -> None:
    out = run_command([sys.executable, "-m", "vitsinks"])
    assert out.returncode == 0, out.stderr
    listed = {ln.split()[0] for ln in out.stdout.splitlines()[1:]}
    assert {"vitsinks.launch", "vitsinks.diagnose", "vitsinks.intervene", "vitsinks.leaderboard",
            "vitsinks.eval.linear", "vitsinks.eval.dense", "vitsinks.bench", "vitsinks.synthetic"} <= listed
    line = next(ln for ln in out.stdout.splitlines() if ln.split()[0] == "vitsinks.leaderboard")
    assert "The leaderboard: every variant's quality and mechanism side by side." in line
