"""Hydra configs: composition, typing, presets."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.helpers.commands import run_command
from vitsinks.configs.schema import load_config
from vitsinks.models import ATTN_KINDS, model_from_config


def launch(*args: str) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", "vitsinks.launch", *args])


def test_defaults_are_the_embedded_cpu_setup() -> None:
    cfg = load_config()
    assert (cfg.exp, cfg.model.size, cfg.data.name, cfg.cluster.name) == ("base", "vit_mini", "synthetic", "local")
    assert cfg.name == "base-vit_mini-synthetic-s0"
    assert cfg.eval.after_train is True  # a finished run is probed: the leaderboard has its numbers


def test_misspelt_key_or_wrong_type_names_it() -> None:
    with pytest.raises(Exception, match="gatee"):
        load_config(["model.gatee=elementwise"])
    with pytest.raises(Exception, match="registers"):
        load_config(["model.registers=many"])


def test_paper_recipe_is_the_kempner_recipe() -> None:
    cfg = load_config(["exp=gate+reg", "recipe=paper"])
    assert cfg.model.size == "vit_large" and cfg.model.patch_size == 16 and not cfg.model.qkv_bias
    assert cfg.model.layerscale_init == 1e-4 and cfg.model.drop_path == 0.1
    assert (cfg.model.gate, cfg.model.registers) == ("elementwise", 4)  # the exp survives the recipe
    assert (cfg.views.n_global, cfg.views.global_size, cfg.views.n_local) == (4, 224, 0)
    assert (cfg.objective.lamb, cfg.objective.slices, cfg.objective.proj_hidden, cfg.objective.proj_out) == \
        (0.02, 256, 2048, 128)
    assert (cfg.train.lr, cfg.train.weight_decay, cfg.train.epochs, cfg.train.batch_size) == (5e-4, 0.05, 100, 256)
    with torch.device("meta"):
        model = model_from_config(cfg.model)
    assert len(model.blocks) == 24 and model.embed_dim == 1024 and model.num_reg_tokens == 4


@pytest.mark.slow
def test_cli_unknown_exp_lists_the_options_and_cfg_job_prints() -> None:
    bad = launch("exp=nonsense")
    assert bad.returncode != 0
    assert "Available options in 'exp'" in bad.stderr and "gate+reg" in bad.stderr
    job = launch("exp=gate+reg", "--cfg", "job")
    assert job.returncode == 0 and "gate: elementwise" in job.stdout and "registers: 4" in job.stdout


@pytest.mark.parametrize("key, bad, allowed", [
    ("model.gate", "sideways", "none, elementwise, headwise"),
    ("model.attn", "tanh", ", ".join(ATTN_KINDS)),  # every registered kind, in the enum's order
    ("model.patch_embed", "conv", "learned, orthonormal"),
    ("model.global_pathway.gate", "open", "learned, hier"),
    ("train.precision", "fp16", "auto, bf16, fp32"),
    ("wandb.mode", "loud", "auto, online, offline, disabled"),
    ("data.on_bad_image", "ignore", "skip, error"),
    ("diagnostics.ratio", "ratio_in", "ratio_out, ratio_head"),
    ("diagnostics.rule", "strict", "relaxed, def1"),
    ("cluster.name", "slurmm", "local, slurm"),
    ("cluster.device", "tpu", "auto, cpu, cuda"),
])
@pytest.mark.slow
def test_closed_sets_stop_at_composition_with_the_allowed_values(key: str, bad: str, allowed: str) -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        load_config([f"{key}={bad}"])
    assert bad in str(err.value) and allowed in str(err.value.__cause__ or err.value)


@pytest.mark.parametrize("key,bad,allowed", [
    ("data.name", "imagenet21k", "synthetic, fashion_mnist, imagenet"),
    ("objective.name", "dino", "lejepa, supervised"),
])
def test_open_sets_stop_at_composition_with_the_registered_values(key: str, bad: str, allowed: str) -> None:
    import vitsinks.data  # noqa: F401 - the registries a command imports
    import vitsinks.objectives  # noqa: F401
    from vitsinks.utils.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config([f"{key}={bad}"])
    assert bad in str(err.value) and allowed in str(err.value)


def test_the_composed_values_are_plain_strings_where_they_are_saved() -> None:
    from vitsinks.configs.schema import to_container

    saved = to_container(load_config(["exp=gate+reg"]))
    assert saved["model"]["gate"] == "elementwise" and type(saved["model"]["gate"]) is str


def test_imagenet_loader_workers_follow_the_machine() -> None:
    from vitsinks.utils.cpus import loader_workers

    cfg = load_config(["data=imagenet", "data.root=/datasets/imagenet"])
    assert cfg.data.num_workers is None and 0 <= loader_workers(cfg.data.num_workers) <= 8


def test_every_imported_package_is_declared() -> None:
    """Each third-party module imported anywhere in vitsinks comes from a dependency in pyproject.toml."""
    import ast
    import importlib.metadata as md
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=\[ ;]", d)[0].lower().replace("_", "-") for d in
                project["dependencies"] + [d for ds in project["optional-dependencies"].values() for d in ds]}
    dists = md.packages_distributions()
    stdlib = sys.stdlib_module_names
    missing = set()
    for path in (root / "vitsinks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                if top in stdlib or top == "vitsinks":
                    continue
                installed = dists.get(top, [{"mmseg": "mmsegmentation", "mmcv": "mmcv-lite"}.get(top, top)])  # optional
                if not {d.lower().replace("_", "-") for d in installed} & declared:
                    missing.add(f"{top} ({path.name})")
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"


def test_readme_install_commands_refresh_package_lists_and_stop_the_cluster() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    second = next(ln for ln in readme.splitlines() if "dataset-fashion-mnist" in ln and "pytest" in ln)
    assert second.index("apt-get update") < second.index("apt-get install")
    assert second.rstrip().endswith("bash slurm/local-cluster.sh stop")


# ---- ranges as field metadata -------------------------------------------------------------------------------------

from vitsinks.configs import schema  # noqa: E402
from vitsinks.configs import upgrade as upgrade_module  # noqa: E402
from vitsinks.configs.checks import NumericField, check_config, numeric_fields  # noqa: E402
from vitsinks.configs.upgrade import upgrade  # noqa: E402
from vitsinks.utils.errors import BadValue, ConfigError  # noqa: E402

NUMERIC = list(numeric_fields(schema.Config))


def test_the_schema_walk_finds_nested_and_list_fields() -> None:
    keys = {f.key: f for f in NUMERIC}
    assert keys["model.global_pathway.state_dim"].kind is int and not keys["model.global_pathway.state_dim"].is_list
    assert keys["views.global_scale"].is_list and keys["views.global_scale"].kind is float
    assert keys["eval.linear_last_blocks"].is_list and keys["eval.linear_last_blocks"].kind is int
    assert "train.compile" not in keys and "model.qkv_bias" not in keys  # booleans are not numbers


def test_every_numeric_field_of_the_schema_declares_a_range() -> None:
    missing = [f.key for f in NUMERIC if f.range is None]
    assert not missing, f"numeric fields without a range (declare one with vitsinks.utils.bounded.bounded): {missing}"


def _outside(f: NumericField, op: str, bound: float) -> float:
    """The nearest value of the field's type that the bound refuses."""
    step = 1 if f.kind is int else 1e-3
    return f.kind({">=": bound - step, ">": bound, "<=": bound + step, "<": bound}[op])


CASES = [(f, op, bound) for f in NUMERIC for op, bound in f.range.bounds()]


@pytest.fixture(scope="module")
def composed():
    return load_config()


@pytest.mark.slow
@pytest.mark.parametrize("f, op, bound", CASES, ids=[f"{f.key}{op}{b:g}" for f, op, b in CASES])
def test_a_value_just_outside_a_bound_is_refused_on_one_line(composed, f, op: str, bound: float) -> None:
    from omegaconf import OmegaConf

    cfg = composed.copy()
    bad = _outside(f, op, bound)
    OmegaConf.update(cfg, f.key, [bad] if f.is_list else bad)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    message = str(err.value)
    shown = f"[{bad}]" if f.is_list else f"{bad}"
    assert "\n" not in message and f"{f.key}={shown} (" in message and f"{op} {bound:g}" in message, message
    if op in (">=", "<="):  # an inclusive bound itself is accepted (whatever else the value breaks)
        OmegaConf.update(cfg, f.key, [bound] if f.is_list else f.kind(bound))
        try:
            check_config(cfg)
        except ConfigError as again:
            assert f"{f.key}=" not in str(again) or "not a multiple" in str(again) or "divisible" in str(again)


def test_none_means_the_default_and_is_not_checked(composed) -> None:
    assert composed.train.max_steps is None and composed.model.depth is None
    check_config(composed)  # no range complains about the None fields


@pytest.mark.parametrize("override", ["views.hflip=1.5", "views.color_jitter=-0.1", "objective.slices=0",
                                      "objective.knots=1", "views.local_scale=[0.0,0.3]", "data.marked_frac=1"])
def test_fields_that_were_unchecked_are_now_checked(override: str) -> None:
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        load_config([override])


# ---- the upgrade path of older configs ----------------------------------------------------------------------------

def test_an_old_config_gets_the_fields_added_since_at_their_defaults_and_keeps_its_own_values() -> None:
    old = {"exp": "gate", "name": "gate-old", "seed": 3, "sweep": None,  # a retired field
           "model": {"size": "vit_cpu", "gate": "elementwise", "registers": 0, "attn": "softmax"},
           "train": {"lr": 1e-3}}
    cfg = upgrade(old)
    assert (cfg.name, cfg.seed, cfg.model.gate, cfg.train.lr) == ("gate-old", 3, "elementwise", 1e-3)
    assert cfg.model.gate is schema.Gate.elementwise  # typed as a composed config
    assert cfg.model.mlp is True and cfg.model.global_pathway.enabled is False and cfg.model.pos_embed == "learn"
    assert "sweep" not in cfg


def test_a_saved_config_round_trips_through_the_upgrade_unchanged() -> None:
    composed = load_config(["exp=gate+reg", "train.lr=0.002"])
    assert schema.to_container(upgrade(schema.to_container(composed))) == schema.to_container(composed)


def test_a_renamed_field_is_mapped_once(monkeypatch) -> None:
    monkeypatch.setitem(upgrade_module.RENAMED, "train.learning_rate", "train.lr")
    assert upgrade({"name": "x", "train": {"learning_rate": 0.25}}).train.lr == 0.25


def test_a_key_the_schema_does_not_know_names_itself_and_the_source() -> None:
    with pytest.raises(BadValue, match=r"runs/x/config.yaml .*'nonsense'"):
        upgrade({"name": "x", "train": {"nonsense": 1}}, "runs/x/config.yaml")


FLOATS = [f for f in NUMERIC if f.kind is float]


def test_inf_and_nan_are_refused_as_not_finite_in_every_float_field(composed) -> None:
    from omegaconf import OmegaConf

    with pytest.raises(ConfigError, match=r"^invalid setting: train\.lr=inf \(must be finite and > 0\)$"):
        load_config(["train.lr=inf"])
    for f in FLOATS:
        allowed = f.range.describe()
        for bad in (float("inf"), float("-inf"), float("nan")):
            cfg = composed.copy()
            OmegaConf.update(cfg, f.key, [bad] if f.is_list else bad)
            with pytest.raises(ConfigError) as err:
                check_config(cfg)
            must = "every entry must be" if f.is_list else "must be"
            said = "finite" if allowed == "finite" else f"finite and {allowed}"
            assert f"{f.key}={[bad] if f.is_list else bad} ({must} {said})" in str(err.value), str(err.value)
