"""The variants are the files of the exp config group: the composed `exp` is the name of the file chosen (a file
needs no `exp:` key), and the run names of the shipped variants and of the committed studies are those of before."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vitsinks.configs import cli
from vitsinks.configs.schema import compose_config, config_dir, exp_names, load_config, to_container
from vitsinks.configs.upgrade import upgrade
from vitsinks.configs.variants import STUDY_VARIANTS, variant_order
from vitsinks.models import run_variant
from vitsinks.run.sweep import expand

ROOT = Path(__file__).resolve().parents[2]
MINE = "# @package _global_\n# A user's variant, without an exp: key.\nmodel:\n  registers: 2\n  gate: headwise\n"


@pytest.fixture
def user_exp(tmp_path: Path) -> list[str]:
    """A config folder of the user's holding `exp/mine.yaml` (no `exp:` key): the override that adds it to Hydra's
    search path."""
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "mine.yaml").write_text(MINE)
    return [f"hydra.searchpath=[file://{tmp_path}]"]


def test_an_exp_file_without_an_exp_key_names_the_run_by_its_file(user_exp: list[str]) -> None:
    cfg = load_config(["exp=mine", *user_exp])
    assert cfg.exp == "mine" and cfg.name == "mine-vit_mini-synthetic-s0"
    assert (cfg.model.registers, cfg.model.gate) == (2, "headwise") and run_variant(cfg) == "gate_headwise+reg2"
    saved = to_container(cfg)  # what a run writes beside it as config.yaml
    assert (saved["exp"], saved["name"]) == ("mine", "mine-vit_mini-synthetic-s0") and upgrade(saved).exp == "mine"


def test_each_run_of_a_sweep_is_named_by_its_exp_file(user_exp: list[str]) -> None:
    cfgs = [cli.compose(combo) for combo in expand(["exp=base,mine", "seed=0,1", *user_exp])]
    assert [c.name for c in cfgs] == ["base-vit_mini-synthetic-s0", "base-vit_mini-synthetic-s1",
                                      "mine-vit_mini-synthetic-s0", "mine-vit_mini-synthetic-s1"]
    assert [c.exp for c in cfgs] == ["base", "base", "mine", "mine"]


def test_cfg_job_prints_the_exp_of_the_file(user_exp: list[str], capsys: pytest.CaptureFixture) -> None:
    cli.hydra_command(lambda cfg: None)(["exp=mine", *user_exp, "--cfg", "job", "--resolve"])
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.exp == "mine" and printed.name == "mine-vit_mini-synthetic-s0"


def test_the_hydra_node_is_kept_only_when_asked_for() -> None:
    assert "hydra" not in compose_config(["exp=gate"])
    cfg = compose_config(["exp=gate"], hydra=True)
    assert cfg.exp == "gate" and cfg.hydra.runtime.choices.exp == "gate"
    assert compose_config(["~exp"]).exp == "base"  # no exp file chosen: the schema's default


@pytest.mark.parametrize("exp", exp_names())
def test_a_shipped_variant_has_no_exp_key_and_keeps_its_run_name(exp: str) -> None:
    assert "exp" not in OmegaConf.load(config_dir() / "exp" / f"{exp}.yaml")
    cfg = load_config([f"exp={exp}"])
    assert (cfg.exp, cfg.name, run_variant(cfg)) == (exp, f"{exp}-vit_mini-synthetic-s0", exp)


def test_the_variants_are_the_exp_files_the_studys_first() -> None:
    order = variant_order()
    assert sorted(order) == exp_names() and len(set(order)) == len(order)
    assert order[:len(STUDY_VARIANTS)] == list(STUDY_VARIANTS)
    assert order[len(STUDY_VARIANTS):] == sorted(order[len(STUDY_VARIANTS):])


@pytest.mark.slow
def test_the_committed_runs_are_named_as_today_composes_them() -> None:
    """Every committed study run of a shipped variant, launched with a default name: today's composition of its exp,
    model, data and seed gives its name and its variant."""
    runs: dict[tuple, list] = {}
    for path in sorted(ROOT.glob("eval/**/inputs/*/config.yaml")):
        saved = OmegaConf.load(path)
        if saved.get("exp") in exp_names() and not saved.get("imported") and \
                saved.name == f"{saved.exp}-{saved.model.size}-{saved.data.name}-s{saved.seed}":
            runs.setdefault((saved.exp, saved.model.size, saved.data.name, saved.seed), []).append(saved)
    assert len(runs) >= 20, "the committed studies were not found"
    for (exp, size, data, seed), saved in runs.items():
        cfg = load_config([f"exp={exp}", f"model={size}", f"data={data}", f"seed={seed}"])
        assert {s.name for s in saved} == {cfg.name}
        assert {run_variant(upgrade(s)) for s in saved} == {run_variant(cfg)}, cfg.name
