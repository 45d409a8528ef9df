"""The user's config folders layered over the package's (`vitsinks.configs.search`): `$VITSINKS_CONFIGS`, `./configs`,
the checkout's `configs/`; and the committed top-level configs (cluster profiles, studies) compose."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.commands import run_command, run_module
from vitsinks.configs import search
from vitsinks.configs.cli import compose
from vitsinks.configs.schema import compose_config, config_dir, load_config, to_container
from vitsinks.configs.usage import help_text
from vitsinks.launch import study_sweep
from vitsinks.run.sweep import expand
from vitsinks.utils.errors import ConfigError, InputNotFound

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "configs").glob("*/*.yaml"))


def profile(folder: Path, name: str, text: str) -> Path:
    """Write `cluster/<name>.yaml` into the configs folder `folder`."""
    path = folder / "cluster" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, no `$VITSINKS_CONFIGS` and no checkout: the package's configs alone."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv(search.ENV, raising=False)
    monkeypatch.setattr(search, "checkout_configs", lambda: None)
    return work


def cluster_options() -> list[str]:
    line = next(ln for ln in help_text("doc", {}).splitlines() if ln.strip().startswith("cluster:"))
    return line.split(":", 1)[1].replace(" ", "").split(",")


def test_a_profile_in_the_folder_the_setting_names_is_an_option_and_composes(bare: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "elsewhere" / "my configs"
    profile(mine, "mylab", "# my lab's GPUs\nname: slurm\npartition: gpu_mylab\ngpus_per_node: 2\n")
    assert "mylab" not in cluster_options()
    monkeypatch.setenv(search.ENV, str(mine))
    cfg = load_config(["cluster=mylab"])
    assert (cfg.cluster.name, cfg.cluster.partition, cfg.cluster.gpus_per_node) == ("slurm", "gpu_mylab", 2)
    assert "mylab" in cluster_options() and {"local", "slurm"} <= set(cluster_options())
    assert search.search_path() == [mine.resolve(), config_dir()]


def test_configs_of_the_working_directory_is_found(bare: Path) -> None:
    profile(bare / "configs", "here", "name: slurm\npartition: here_part\n")
    assert load_config(["cluster=here"]).cluster.partition == "here_part"
    assert "here" in cluster_options()


def test_a_user_file_replaces_the_package_one_and_the_setting_wins_over_the_working_directory(
        bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config().cluster.cpus_per_task == 8  # the package's local.yaml, the schema's default
    profile(bare / "configs", "local", "name: local\ncpus_per_task: 3\n")
    assert load_config().cluster.cpus_per_task == 3  # the default option, `cluster: local`, is now the user's
    env = tmp_path / "env"
    profile(env, "local", "name: local\ncpus_per_task: 5\n")
    monkeypatch.setenv(search.ENV, str(env))
    assert load_config().cluster.cpus_per_task == 5
    assert cluster_options().count("local") == 1


def test_the_setting_naming_a_missing_folder_is_one_line_naming_it(bare: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no such folder"
    monkeypatch.setenv(search.ENV, str(missing))
    with pytest.raises(InputNotFound, match=f"{search.ENV}=.*no folder {missing}.*unset it"):
        compose([])
    assert f"note: {search.ENV}=" in help_text("doc", {})  # help still answers
    out = run_module("vitsinks.launch", "--cfg", "job", env={**os.environ, search.ENV: str(missing)}, cwd=bare)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"error: {search.ENV}={missing}: no folder {missing.resolve()}")
    assert out.stderr.count("\n") == 1


def test_with_no_user_configs_composition_is_the_packages(bare: Path) -> None:
    assert search.user_folders() == [] and search.search_path() == [config_dir()]
    cfg = compose_config(["exp=gate+reg"], hydra=True)
    assert [s.provider for s in cfg.hydra.runtime.config_sources] == ["hydra", "main", "schema"]
    assert cluster_options() == ["local", "slurm"]
    assert "  study: registers" in help_text("doc", {}).splitlines()  # the package's own study, none of the checkout's


def test_the_checkout_configs_are_found_only_from_a_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert search.checkout_configs() == ROOT / "configs"  # these tests run from the checkout
    monkeypatch.setattr(search, "CHECKOUT", tmp_path)  # an install: no pyproject.toml of vitsinks beside the package
    (tmp_path / "configs").mkdir()
    assert search.checkout_configs() is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    assert search.checkout_configs() is None


@pytest.mark.slow
def test_an_installed_package_runs_from_an_empty_folder(tmp_path: Path) -> None:
    """The package copied out of the checkout (as an install has it) composes from a folder without configs/."""
    site, empty = tmp_path / "site", tmp_path / "empty"
    shutil.copytree(config_dir().parent, site / "vitsinks", ignore=shutil.ignore_patterns("__pycache__"))
    empty.mkdir()
    code = ("from vitsinks.configs import search; from vitsinks.configs.schema import load_config as load; "
            "print(search.search_path(), load(['exp=gate+reg']).name, load(['cluster=slurm']).cluster.name)")
    env = {k: v for k, v in os.environ.items() if k != search.ENV} | {"PYTHONPATH": str(site)}
    out = run_command([sys.executable, "-c", code], cwd=empty, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"[PosixPath('{site / 'vitsinks' / 'configs'}')] gate+reg-vit_mini-synthetic-s0 slurm"


# The committed top-level configs: every file composes as what it is.

@pytest.mark.parametrize("path", COMMITTED, ids=[str(p.relative_to(ROOT)) for p in COMMITTED])
def test_a_committed_config_composes(path: Path) -> None:
    group, name = path.parent.name, path.stem
    assert not (config_dir() / group / path.name).exists(), "a committed user config shadows the package's own"
    if group != "study":
        cfg = load_config([f"{group}={name}"])
        assert OmegaConf.is_dict(cfg) and to_container(cfg)
        return
    sweep = study_sweep([f"study={name}"])
    axes = [[combo[0] for combo in expand([override])] for override in sweep]  # each override's values
    assert len(expand(sweep)) > 1  # a study is a sweep
    for i, values in enumerate(axes):  # every value of every axis composes, with the other axes' first values
        for value in values:
            load_config([value if j == i else a[0] for j, a in enumerate(axes)])


def test_cluster_profiles_and_studies_are_committed_beside_the_package() -> None:
    assert {"cluster/example_a100.yaml", "cluster/local_slurm.yaml", "study/paper_gate_reg.yaml"} <= {
        str(p.relative_to(ROOT / "configs")) for p in COMMITTED}
    assert {p.stem for p in (config_dir() / "cluster").glob("*.yaml")} == {"local", "slurm"}  # what the package needs


# Studies: a sweep by name.

def test_a_study_is_its_sweep_and_the_command_line_wins_on_a_key_it_also_gives(bare: Path) -> None:
    study = bare / "configs" / "study" / "tiny.yaml"
    study.parent.mkdir(parents=True)
    study.write_text("# @package _global_\nhydra:\n  sweeper:\n    params:\n      exp: base,gate\n      seed: 0,1\n"
                     "      model: vit_cpu\n")
    assert study_sweep(["study=tiny", "runs_dir=r"]) == ["exp=base,gate", "seed=0,1", "model=vit_cpu", "runs_dir=r"]
    assert study_sweep(["seed=3", "study=tiny"]) == ["exp=base,gate", "seed=3", "model=vit_cpu"]
    assert study_sweep(["exp=reg"]) == ["exp=reg"]
    with pytest.raises(ConfigError, match="one study per sweep"):
        study_sweep(["study=tiny,tiny"])
    (bare / "configs" / "study" / "empty.yaml").write_text("# @package _global_\nseed: 1\n")
    with pytest.raises(ConfigError, match="study=empty sweeps nothing"):
        study_sweep(["study=empty"])


def test_paper_study_is_the_sweep_the_docs_typed_out() -> None:
    typed = ["exp=base,gate,reg,gate+reg", "seed=0,1,2", "recipe=paper", "data=imagenet"]
    assert sorted(study_sweep(["study=paper_gate_reg"])) == sorted(typed)


def test_a_study_without_m_is_one_line() -> None:
    out = run_module("vitsinks.launch", "study=paper_gate_reg", cwd=ROOT)
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert "study=paper_gate_reg is a sweep: run it with -m" in out.stderr


def test_studies_run_by_eval_scripts_are_the_committed_ones() -> None:
    scripts = [ROOT / "eval" / "make_leaderboard.sh", ROOT / "eval" / "sinktasks" / "make_sinktask_leaderboard.sh"]
    for script, name in zip(scripts, ("vit_cpu_leaderboard", "sinktasks"), strict=True):
        assert f"-m study={name} " in script.read_text() and (ROOT / "configs" / "study" / f"{name}.yaml").is_file()


def test_help_of_a_fresh_interpreter_lists_the_checkouts_profiles() -> None:
    out = subprocess.run([sys.executable, "-m", "vitsinks.launch", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, env={k: v for k, v in os.environ.items() if k != search.ENV})
    cluster = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("cluster:"))
    assert "example_a100" in cluster and "local_slurm" in cluster
