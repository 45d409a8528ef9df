"""`--help` and `-h` of every command and sub-command: exit 0, the usage printed, no torch imported, cheap."""

from __future__ import annotations

import importlib
import inspect
import resource
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.helpers.commands import run_module
from vitsinks.__main__ import commands
from vitsinks.configs import usage

ROOT = Path(__file__).resolve().parents[2]
HELP_CPU_S = 3.0  # the bound; the help path itself takes ~0.1 s


def invocations() -> list[list[str]]:
    """Every command and sub-command found in the source, as `python -m` argument lists."""
    out = []
    for name in commands():
        out.append([name])
        out += [[name, word] for word in usage.Source.of(name).subcommands()]
    return out


CASES = [(cmd, flag) for cmd in invocations() for flag in usage.HELP_FLAGS]


def test_the_cases_cover_the_commands_and_launch_status() -> None:
    assert ["vitsinks.launch", "status"] in invocations()
    assert {c[0] for c in invocations()} == set(commands()) and len(commands()) >= 10


def fresh_help(cmd: list[str], flag: str) -> tuple[subprocess.CompletedProcess, float, set[str]]:
    """`python -X importtime -m <cmd> <flag>` in a fresh interpreter: (the result, its CPU seconds measured with
    getrusage, the modules it imported)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", *cmd, flag], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in out.stderr.splitlines() if ln.startswith("import time:")}
    return out, cpu, imported


@pytest.mark.parametrize("cmd, flag", CASES, ids=[" ".join([*c, f]) for c, f in CASES])
def test_help_exits_0_with_the_usage_without_importing_torch(cmd: list[str], flag: str) -> None:
    out, cpu, imported = fresh_help(cmd, flag)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"python -m {cmd[0]}" in out.stdout or f"python -m {cmd[0].rsplit('.', 1)[0]}" in out.stdout
    assert "-h, --help" in out.stdout or "--help" in out.stdout
    assert "vitsinks" in imported and not {"torch", "timm", "hydra", "omegaconf"} & imported, sorted(imported)
    assert cpu < HELP_CPU_S, f"{' '.join(cmd)} {flag} took {cpu:.2f} s of CPU"
    if len(cmd) > 1:  # a sub-command's own text
        assert out.stdout.startswith(f"python -m {cmd[0]} {cmd[1]}: ") and len(out.stdout.splitlines()[0]) > 40


@pytest.mark.parametrize("cmd", invocations(), ids=" ".join)
def test_in_process_help_is_the_same_text(cmd: list[str]) -> None:
    """The entry points themselves (a preloaded interpreter that imported the command: `tests/helpers/preloaded.py`)
    answer `--help` with the text `python -m` gives before importing it."""
    inproc = run_module(*cmd, "--help")
    assert inproc.returncode == 0, inproc.stderr[-2000:]
    assert inproc.stdout.strip() == usage.command_help(cmd[0], cmd[1:]).strip()


def entry_point_aliases(module: types.ModuleType) -> dict[str, str]:
    """The `aliases` a Hydra command's entry point (`cli.hydra_command`'s `main`) holds in its closure."""
    for obj in vars(module).values():
        if inspect.isfunction(obj) and obj.__closure__:
            free = inspect.getclosurevars(obj).nonlocals
            if "fn" in free and "aliases" in free:
                return dict(free["aliases"] or {})
    return {}


@pytest.mark.parametrize("name", [n for n in commands() if usage.Source.of(n).is_hydra])
def test_short_keys_read_from_the_source_are_the_entry_points(name: str) -> None:
    assert usage.Source.of(name).aliases() == entry_point_aliases(importlib.import_module(name))


def test_plain_arguments_show_type_default_and_comment() -> None:
    text = usage.command_help("vitsinks.leaderboard")
    assert "runs=<str | None> (default None): a folder of run directories" in text
    gpu = usage.command_help("vitsinks.bench", ["gpu"])  # a part's arguments: the GPU benchmark's own
    assert "what=<str> (default 'run') (or as the first bare word)" in gpu and "(default ['eager', 'compiled'])" in gpu


def test_what_is_not_a_command_is_not_answered(monkeypatch, capsys) -> None:
    for name in ("vitsinks", "vitsinks.configs.schema", "vitsinks.nothing", "numpy"):
        with pytest.raises(LookupError, match="not a vitsinks command"):
            usage.Source.of(name)
    monkeypatch.setattr(sys, "argv", ["-m", "--help"])
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "vitsinks", "--help"], raising=False)
    usage.answer_help()  # returns: `python -m vitsinks` prints its own listing
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-X", "utf8", "-m", "vitsinks.leaderboard", "-h"])
    with pytest.raises(SystemExit) as stop:
        usage.answer_help()
    assert stop.value.code == 0 and "arguments (key=value)" in capsys.readouterr().out


def test_python_m_vitsinks_help_lists_the_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "vitsinks", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "vitsinks.leaderboard" in out.stdout and "--help" in out.stdout.splitlines()[0]
