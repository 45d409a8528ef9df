"""`python -m vitsinks`: the commands, found in the source, one line each."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.helpers.commands import run_command
from vitsinks.__main__ import commands

ROOT = Path(__file__).resolve().parents[1]


def test_commands_are_the_modules_that_run_as_main_with_their_docstring_line(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "tool").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The package."""\n')
    (pkg / "__main__.py").write_text('"""This listing."""\n')
    (pkg / "run.py").write_text('"""Run things.\n\nMore text.\n"""\n\nif __name__ == "__main__":\n    pass\n')
    (pkg / "library.py").write_text('"""Not a command."""\n\ndef f() -> None:\n    pass\n')
    (pkg / "tool" / "__init__.py").write_text('"""A tool package."""\n')
    (pkg / "tool" / "__main__.py").write_text('"""`python -m pkg.tool`."""\n')  # no command: commands are modules
    (pkg / "tool" / "go.py").write_text('"""Go.\n"""\nif __name__ == "__main__":\n    pass\n')
    assert commands(pkg) == {"pkg.run": "Run things.", "pkg.tool.go": "Go."}


def documented_commands() -> set[str]:
    """Every `python -m vitsinks.<command>` the README, docs/, slurm/ and eval/ (docs and scripts) name."""
    docs = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "slurm").rglob("*.md"),
            *(ROOT / "eval").rglob("README.md"), *(ROOT / "eval").rglob("*.sh")]
    return {m for d in docs for m in re.findall(r"python -m (vitsinks\.[a-z_.]*[a-z_])", d.read_text())}


def test_python_m_vitsinks_lists_every_documented_command() -> None:
    out = run_command([sys.executable, "-m", "vitsinks"])
    assert out.returncode == 0, out.stderr
    listed = {(cells := ln.split(None, 1))[0]: cells[1:] for ln in out.stdout.splitlines()[1:]}
    documented = documented_commands()
    assert {"vitsinks.launch", "vitsinks.diagnose", "vitsinks.leaderboard"} <= documented  # the docs were read
    assert documented <= set(listed), f"documented but not a command: {documented - set(listed)}"
    assert all(listed.values()), "a command without a docstring line"
    usage = [name for name, line in listed.items() if line[0].lstrip("`").startswith("python -m")]
    assert usage == [], f"a docstring whose first line is a usage line, not what the command does: {usage}"
    assert listed["vitsinks.leaderboard"] == ["The leaderboard: every variant's quality and mechanism side by side."]
