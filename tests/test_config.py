"""Hydra configs: composition, typing, presets."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from vitsinks.config import load_config
from vitsinks.models import model_from_config


def launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vitsinks.launch", *args], capture_output=True, text=True,
                          timeout=600)


def test_defaults_are_the_embedded_cpu_setup() -> None:
    cfg = load_config()
    assert (cfg.exp, cfg.model.size, cfg.data.name, cfg.cluster.name) == ("base", "vit_cpu", "synthetic", "local")
    assert cfg.name == "base-vit_cpu-synthetic-s0"


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


def test_cli_unknown_exp_lists_the_options_and_cfg_job_prints() -> None:
    bad = launch("exp=nonsense")
    assert bad.returncode != 0
    assert "Available options in 'exp'" in bad.stderr and "gate+reg" in bad.stderr
    job = launch("exp=gate+reg", "--cfg", "job")
    assert job.returncode == 0 and "gate: elementwise" in job.stdout and "registers: 4" in job.stdout
