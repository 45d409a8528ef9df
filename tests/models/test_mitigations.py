"""The block-mitigation registry: config fields, state-dict names, variant tags and leaderboard columns derive from
it, for every registered mitigation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.helpers.tiny import TINY_VIT
from vitsinks.configs.schema import load_config
from vitsinks.models import MITIGATIONS, ModelConfig, arch_keys, build_vit, mitigation_columns, variant_name
from vitsinks.models.layout import KeyLayout
from vitsinks.train.checkpoint import ARCH_KEYS
from vitsinks.utils.results import Column

ON = {name: m.example for name, m in MITIGATIONS.items()}  # each mitigation's own "on" setting


@pytest.mark.parametrize("name", sorted(MITIGATIONS))
def test_a_mitigation_is_a_model_config_field_off_by_default_that_shapes_the_architecture(name: str) -> None:
    m = MITIGATIONS[name]
    field = {f.name: f for f in dataclasses.fields(ModelConfig)}[name]
    default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    assert m.setting(default) is None and m.tag(None) is None
    assert m.setting(ON[name]) is not None and m.tag(m.setting(ON[name]))
    assert name in arch_keys() and name in ARCH_KEYS
    assert variant_name({name: ON[name]}) == m.tag(m.setting(ON[name]))
    assert m.arch(default) != m.arch(ON[name])


@pytest.mark.parametrize("name", sorted(MITIGATIONS))
def test_a_mitigation_adds_its_module_at_its_attribute_to_every_block_and_nothing_else(name: str) -> None:
    m = MITIGATIONS[name]
    base = build_vit("vit_cpu", **TINY_VIT)
    model = build_vit("vit_cpu", **TINY_VIT, **{name: ON[name]})
    prefix = m.attr if m.site == "update" else "attn." + m.attr  # heads and keys: on the attention module
    added = set(model.state_dict()) - set(base.state_dict())
    tokens = {"reg_token"} if m.prefix_tokens(m.setting(ON[name])) else set()  # its own tokens: the register slots
    assert tokens <= added
    added -= tokens
    assert added and all(k.split(".", 2)[2].startswith(prefix + ".") for k in added)
    assert {k.split(".")[1] for k in added} == {str(i) for i in range(TINY_VIT["depth"])}
    assert set(base.state_dict()) <= set(model.state_dict())


def test_todays_state_dict_names_are_kept() -> None:
    sd = build_vit("vit_cpu", **TINY_VIT, gate="headwise", global_pathway={"gate": "hier"}).state_dict()
    assert {"blocks.0.attn.gate.weight", "blocks.0.attn.gate.bias", "blocks.1.pathway.inp.weight",
            "blocks.1.pathway.gamma_bias", "blocks.1.pathway.out.weight"} <= set(sd)
    assert sd["blocks.0.attn.gate.weight"].shape == (3, 48) and sd["blocks.1.pathway.gamma_bias"].shape == (3,)


def test_the_config_keys_users_type_are_kept() -> None:
    cfg = load_config(["model.gate=headwise", "model.global_pathway.enabled=true", "model.global_pathway.state_dim=8",
                       "model.global_pathway.gate=hier", "model.global_pathway.layerscale_init=0.1"])
    model = build_vit("vit_cpu", **TINY_VIT, gate=cfg.model.gate, global_pathway=cfg.model.global_pathway)
    pw = model.blocks[0].pathway
    assert model.blocks[0].attn.gate_kind == "headwise" and pw.gate_kind == "hier" and pw.w_value.shape[0] == 8
    assert torch.allclose(pw.ls3.gamma, torch.full((48,), 0.1))
    off = build_vit("vit_cpu", **TINY_VIT, global_pathway=load_config().model.global_pathway)
    assert off.blocks[0].pathway is None


@pytest.mark.parametrize("name", sorted(MITIGATIONS))
def test_leaderboard_columns_come_from_the_registry_with_values_from_its_own_summary(name: str) -> None:
    """A diagnosis holding a mitigation's fields (random values, fill values in one block without it) summarises
    into a summary from which its columns take finite values; an empty summary gives none."""
    m = MITIGATIONS[name]
    cols = mitigation_columns()
    assert all(isinstance(c, Column) for c in cols) and len({c.key for c in cols}) == len(cols)
    rng = np.random.default_rng(0)
    d = {k: rng.uniform(0.1, 0.9, (5, 3)) if not k.endswith("token") else rng.integers(0, 9, (5, 3)).astype(float)
         for k in m.diagnostic_fields}
    for k, fill in m.diagnostic_fields.items():
        d[k][:, 0] = fill  # block 0 lacks it
    summary = m.summarise(d, KeyLayout(registers=0, patches=8))
    values = m.leaderboard_values(summary)
    assert set(values) == {c.key for c in m.columns}
    assert all(np.isfinite(v) for v in values.values())
    assert m.leaderboard_values({}) == {}
