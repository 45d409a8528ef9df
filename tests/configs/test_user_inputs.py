"""What Hydra or the file system would answer with a traceback, answered in one line (`vitsinks.configs.user_inputs`): a
user config file that is not YAML, a non-ASCII value, a run name the file system cannot hold."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.tiny import tiny_cfg
from vitsinks.configs import search, user_inputs
from vitsinks.configs.cli import compose
from vitsinks.configs.schema import load_config
from vitsinks.diagnose import cli as diagnose_cli
from vitsinks.launch import cli as launch_cli
from vitsinks.posthoc.method import METHODS
from vitsinks.run.derive import derived_run
from vitsinks.run.sweep import expand, name_runs
from vitsinks.utils.errors import ConfigError


@pytest.fixture
def mine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's configs folder (`$VITSINKS_CONFIGS`), an empty working directory, no checkout's configs."""
    work, folder = tmp_path / "work", tmp_path / "my configs"
    work.mkdir()
    folder.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv(search.ENV, str(folder))
    monkeypatch.setattr(search, "checkout_configs", lambda: None)
    return folder


def one_error_line(capsys: pytest.CaptureFixture[str], run) -> str:
    with pytest.raises(SystemExit) as exit_:
        run()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(err) == 1, err
    return err[0]


def test_a_broken_user_config_is_one_line_naming_the_file_the_line_and_what_it_overrides(
        mine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = mine / "model" / "vit_mini.yaml"
    broken.parent.mkdir()
    broken.write_text("depth: 2\nembed_dim: [48\nnum_heads: 3\n")  # an unclosed list
    line = one_error_line(capsys, lambda: diagnose_cli(["model=vit_mini", "--cfg", "job"]))
    assert line.startswith(f"error: {broken}, line 3, column 10: not valid YAML (expected ',' or ']'")
    assert "it overrides the package's vitsinks/configs/model/vit_mini.yaml" in line
    assert (search.PACKAGE_CONFIGS / "model" / "vit_mini.yaml").is_file()
    added = mine / "model" / "mine.yaml"
    added.write_text("size: vit_mini\n depth: 2\n")  # a bad indent, in an option of the user's own
    with pytest.raises(ConfigError, match=r"mine.yaml, line 2, .*it adds the option model=mine \(no package file"):
        load_config(["model=mine"])


def test_a_non_ascii_value_is_taken_as_written(tmp_path: Path) -> None:
    cfg = load_config(["data.root=/data/ímage", "name=été", f"runs_dir={tmp_path}"])
    assert (cfg.data.root, cfg.name) == ("/data/ímage", "été")
    assert load_config(["name='ça'"]).name == "ça"  # quoted by the user: left as written
    assert user_inputs.quote_unicode(["name=été,ça", "+x=a", "name='été'", "name=[été]"]) == [
        "name='été','ça'", "+x=a", "name='été'", "name=[été]"]  # a sweep stays a sweep; grammar left alone
    combos = expand(["name=été,ça", "seed=1"])
    assert [compose(c, check=False).name for c in combos] == ["été", "ça"]


def test_a_non_ascii_value_that_cannot_be_quoted_safely_is_answered_with_the_fix(
        capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, lambda: diagnose_cli(["name=[été", "--cfg", "job"]))
    assert line.startswith("error: name=[été: Hydra reads a non-ASCII character only inside quotes")
    assert "key='été'" in line and "docs/commands.md, How arguments work" in line
    with pytest.raises(ConfigError, match="a key is ASCII"):
        expand(["nämé=1"])


def test_a_run_name_the_file_system_cannot_hold_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    most = os.pathconf(tmp_path, "PC_NAME_MAX")
    limit = most - user_inputs.NAME_SUFFIX
    too_long = "é" * (limit // 2 + 1)  # fewer characters than the limit, more bytes
    line = one_error_line(capsys, lambda: launch_cli(["exp=base", f"name={too_long}", f"runs_dir={runs}",
                                                      "train.max_steps=1"]))
    assert f"({len(too_long)} characters, {2 * len(too_long)} bytes: a run name holds at most {limit} bytes" in line
    assert not runs.exists()  # nothing ran, nothing was made
    assert load_config([f"name={'a' * limit}", f"runs_dir={runs}"]).name == "a" * limit
    with pytest.raises(ConfigError, match="give a shorter runs_dir="):
        load_config([f"runs_dir={tmp_path / ('r' * (most + 1))}"])
    # the longest name allowed, with the longest suffixes vitsinks adds, is a folder this file system holds
    (tmp_path / ("a" * limit + "-" + "s" * 48 + "@step_0000000+" + "m" * 24)).mkdir()


def test_the_suffix_reserve_covers_what_vitsinks_adds_to_a_run_name(runs: Path) -> None:
    assert max(len(m.encode()) for m in METHODS) <= 24
    cfg = tiny_cfg(runs, f"ckpt={runs / 'a' / 'checkpoints' / 'step_0000100.pt'}")
    for m in METHODS:
        assert len(derived_run(cfg, m).name.encode()) - 1 <= user_inputs.NAME_SUFFIX - 49  # `a` and its suffix
    combos = [[f"train.lr={'1' * 60}"], [f"train.lr={'2' * 60}"]]
    cfgs = [tiny_cfg(runs, "name=base") for _ in combos]
    base = cfgs[0].name
    name_runs(combos, cfgs)
    assert all(c.name != base and len(c.name.encode()) - len(base) <= 49 for c in cfgs)
