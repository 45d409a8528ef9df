"""The command-line layer: one line and a non-zero exit for bad input on every entry point, tracebacks for bugs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.commands import one_line_error, run_commands, run_module
from tests.helpers.tiny import TINY
from vitsinks.configs import cli
from vitsinks.utils.errors import BadValue, CheckFailed, ConfigError, InputNotFound


def test_guarded_prints_user_errors_on_one_line_and_keeps_tracebacks_of_bugs(capsys) -> None:
    def user() -> None:
        raise InputNotFound("data.root /x does not exist:\n  point data.root at the folder")

    with pytest.raises(SystemExit) as exit_:
        cli.guarded(user)
    assert exit_.value.code == 1
    assert capsys.readouterr().err == "error: data.root /x does not exist: point data.root at the folder\n"

    def check() -> None:
        raise CheckFailed("block 2 differs by 3e-3")

    with pytest.raises(SystemExit) as exit_:
        cli.guarded(check)
    assert exit_.value.code == 3 and "built-in check failed: block 2" in capsys.readouterr().err

    def bug() -> None:
        raise ValueError("an internal invariant broke")  # not a UserError: a bug, its traceback must stay

    with pytest.raises(ValueError, match="internal invariant"):
        cli.guarded(bug)

    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError

    from vitsinks.configs.schema import DataConfig

    def config_bug() -> None:  # vitsinks code reading a key the schema does not have: a bug, not a user's typo
        OmegaConf.structured(DataConfig).nmae  # noqa: B018

    with pytest.raises(ConfigAttributeError):
        cli.guarded(config_bug)


def test_parse_args_names_unknown_keys_wrong_types_and_stray_words() -> None:
    from vitsinks.bench import BenchArgs

    args = cli.parse_args(["train", "batch=8"], BenchArgs, "usage", positional="what")
    assert args.what == "train" and args.batch == 8 and args.size is None
    with pytest.raises(ConfigError, match="sise"):
        cli.parse_args(["train", "sise=vit_small"], BenchArgs, "usage", positional="what")
    with pytest.raises(ConfigError, match="batch"):
        cli.parse_args(["train", "batch=many"], BenchArgs, "usage", positional="what")
    with pytest.raises(ConfigError, match="unexpected argument"):
        cli.parse_args(["train", "extra"], BenchArgs, "usage", positional="what")


def test_rewrite_aliases() -> None:
    aliases = {"n_images": "intervene.n_images", "heads": "intervene.heads"}
    assert cli.rewrite_aliases(["n_images=4", "heads=0:1", "heads_x=1", "data=voc"], aliases, lists=("heads",)) == \
        ["intervene.n_images=4", "intervene.heads=[0:1]", "heads_x=1", "data=voc"]


MISTAKES = [  # (override, what its one-line error names)
    ("model=vit_gigantic", "Could not find 'model/vit_gigantic'"),
    ("train.batchsize=8", "batchsize"),
    ("train.batch_size=many", "batch_size"),
    ("model.gate=sideways", "expected one of [none, elementwise, headwise]"),
]


@pytest.mark.slow
def test_config_mistakes_get_one_line_with_and_without_a_sweep(tmp_path: Path) -> None:
    launch = [sys.executable, "-m", "vitsinks.launch"]
    commands = [[*launch, *sweep, mistake, f"runs_dir={tmp_path}"]
                for mistake, _ in MISTAKES for sweep in ([], ["-m", "exp=base,gate"])]
    lines = [one_line_error(done) for done in run_commands(commands)]
    for (mistake, expected), single, sweep in zip(MISTAKES, lines[::2], lines[1::2], strict=True):
        assert expected in single and expected in sweep, mistake
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing trained, submitted or written


@pytest.mark.parametrize("override, field", [
    ("train.batch_size=-4", "train.batch_size=-4"), ("train.batch_size=0", "train.batch_size=0"),
    ("model.depth=0", "model.depth=0"), ("model.depth=-1", "model.depth=-1"), ("train.lr=inf", "train.lr=inf"),
    ("model.img_size=30", "model.img_size=30 is not a multiple of model.patch_size=8"),
    ("model.num_heads=5", "model.embed_dim=128 is not divisible by model.num_heads=5"),
])
def test_numbers_out_of_range_stop_at_composition(override: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("+", r"\+").replace(".", r"\.")):
        cli.compose([override])


@pytest.mark.slow
def test_bad_numbers_from_the_command_line_leave_no_run(tmp_path: Path) -> None:
    line = one_line_error(run_module("vitsinks.launch", *TINY, "train.batch_size=-4", f"runs_dir={tmp_path}"))
    assert "train.batch_size=-4 (must be >= 1)" in line
    assert not any(tmp_path.iterdir())  # nothing trained or written


@pytest.mark.parametrize("module, args, expected", [
    ("vitsinks.leaderboard", ["runs=/nowhere/at/all"], "neither a run folder nor a sweep"),
    ("vitsinks.leaderboard", ["rnus=x"], "rnus"),
    ("vitsinks.synthetic", ["task=triggr"], "unknown task 'triggr'"),
    ("vitsinks.synthetic", ["steps=-3"], "steps=-3"),
    ("vitsinks.bench", ["trian"], "which benchmark"),
    ("vitsinks.bench", ["train", "batch=0"], "must be > 0"),
    ("vitsinks.launch", ["status"], "no sweep given"),
    ("vitsinks.launch", ["status", "sweep=/nowhere"], "no sweep manifest"),
    ("vitsinks.diagnose", ["ckpt=/nowhere/last.pt"], "checkpoint /nowhere/last.pt not found"),
    ("vitsinks.eval.linear", ["ckpt=/nowhere/last.pt"], "checkpoint /nowhere/last.pt not found"),
    ("vitsinks.intervene", ["ckpt=/nowhere/last.pt"], "checkpoint /nowhere/last.pt not found"),
    ("vitsinks.diagnose", [], "name the model: ckpt="),  # no checkpoint, run or pretrained model
    ("vitsinks.eval.linear", [], "name the model: ckpt="),
])
@pytest.mark.slow
def test_every_entry_point_reports_bad_input_on_one_line(module: str, args: list[str], expected: str) -> None:
    assert expected in one_line_error(run_module(module, *args))


def test_user_error_types_are_also_the_builtin_types() -> None:
    assert issubclass(InputNotFound, FileNotFoundError) and issubclass(BadValue, ValueError)
    assert not issubclass(CheckFailed, BadValue)


def test_a_command_reading_a_checkpoint_keeps_its_data_unless_the_command_line_chooses_other_data() -> None:
    from omegaconf import OmegaConf

    from vitsinks.configs.schema import DataConfig

    cli_data = OmegaConf.structured(DataConfig(name="voc", root="/v", on_bad_image="error"))
    ckpt_data = OmegaConf.structured(DataConfig(name="imagenet", root="/i"))
    assert cli.pick_data(cli_data, ckpt_data, []) == ckpt_data
    assert cli.pick_data(cli_data, ckpt_data, None) == cli_data  # from Python: the config given
    assert cli.pick_data(cli_data, ckpt_data, ["data", "data.root"]).name == "voc"
    only_policy = cli.pick_data(cli_data, ckpt_data, ["data.on_bad_image"])
    assert (only_policy.name, only_policy.root, only_policy.on_bad_image) == ("imagenet", "/i", "error")


def test_a_command_reading_a_checkpoint_probes_with_its_training_seed_unless_the_command_line_gives_one() -> None:
    assert cli.pick_seed(0, 1, ["ckpt", "data.root"]) == 1  # no seed= on the command line: the checkpoint's
    assert cli.pick_seed(3, 1, ["ckpt", "seed"]) == 3
    assert cli.pick_seed(0, 1, None) == 0  # from Python: the config given


def test_a_string_argument_is_taken_as_written() -> None:
    from vitsinks.configs.cli import parse_args
    from vitsinks.leaderboard import LeaderboardArgs

    args = parse_args(["runs=x", "title=sink tasks: 1 block, 2 heads"], LeaderboardArgs, "usage")
    assert args.title == "sink tasks: 1 block, 2 heads" and args.out is None  # not the YAML mapping {sink tasks: ...}


# ---- one composition per command ----------------------------------------------------------------------------------

def test_a_command_composes_once_and_gets_the_typed_checked_config(monkeypatch) -> None:
    from vitsinks.configs import schema

    calls: list[list[str]] = []
    real = schema.compose_config

    def counting(overrides, hydra=False):
        calls.append(list(overrides))
        return real(overrides, hydra=hydra)

    monkeypatch.setattr(cli, "compose_config", counting)
    seen = {}

    def fn(cfg) -> None:
        seen.update(cfg=cfg, data=cli.data_overrides())

    cli.hydra_command(fn, aliases={"n_images": "diagnostics.n_images"})(["n_images=3", "data.on_bad_image=error"])
    assert calls == [["diagnostics.n_images=3", "data.on_bad_image=error"]]
    assert seen["cfg"].diagnostics.n_images == 3 and "hydra" not in seen["cfg"]
    assert seen["data"] == ["data.on_bad_image"]  # what the command line set, for commands reading a checkpoint
    assert cli.data_overrides() is None  # cleared after the command: Python callers get the config they pass


def test_help_lists_the_groups_and_cfg_prints_without_running(capsys) -> None:
    ran = []
    main = cli.hydra_command(ran.append, aliases={"n_images": "diagnostics.n_images"})
    main(["--help"])
    out = capsys.readouterr().out
    assert "exp: " in out and "gate+reg" in out and "n_images= (diagnostics.n_images=)" in out
    main(["exp=gate", "--cfg", "job"])
    out = capsys.readouterr().out
    assert "gate: elementwise" in out and "hydra:" not in out
    main(["exp=gate", "--cfg=hydra"])
    assert capsys.readouterr().out.startswith("hydra:")
    assert ran == []


@pytest.mark.parametrize("args, expected", [
    (["--info"], "unknown option --info"), (["--cfg", "everything"], "--cfg takes one of job, hydra, all"),
    (["-m", "exp=base,gate"], "unknown option -m"),
])
def test_flags_a_command_does_not_take_are_one_line(args: list[str], expected: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.hydra_command(lambda cfg: None)(args)
    assert exit_.value.code == 1 and capsys.readouterr().err.startswith(f"error: {expected}")
