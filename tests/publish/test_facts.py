"""The card's facts: the variant's settings, tags and description from the registries and its exp config; the model
notes are exactly the settings of `recipe=paper` (read from its file here) that the run has otherwise."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.helpers.tiny import TINY_VIT, tiny_cfg
from vitsinks.configs.schema import config_dir, load_config
from vitsinks.models import ATTN_KINDS, MITIGATIONS, SIZES
from vitsinks.models.kinds import DEFAULT_KIND
from vitsinks.publish.facts import exp_description, hub_tags, recipe_notes, shown, variant_settings

PAPER = config_dir() / "recipe" / "paper.yaml"


def test_the_gate_reg_variant_is_its_settings_tags_and_description() -> None:
    cfg = load_config(["exp=gate+reg"])
    assert variant_settings(cfg.model) == {"model.registers": "4", "model.gate": "elementwise"}
    assert {"gated-attention", "registers"} <= set(hub_tags(cfg.model))
    comment = (config_dir() / "exp" / "gate+reg.yaml").read_text().splitlines()[1]  # under `# @package _global_`
    assert exp_description("gate+reg") == comment.lstrip("# ")


@pytest.mark.parametrize("kind", [k for k in ATTN_KINDS if k != DEFAULT_KIND])
def test_every_attention_kind_is_a_setting_and_a_tag(kind: str) -> None:
    model = {"attn": kind, "registers": 0}
    assert variant_settings(model) == {"model.attn": kind} and f"{kind}-attention" in hub_tags(model)


@pytest.mark.parametrize("name", sorted(MITIGATIONS))
def test_every_mitigation_switched_on_is_a_setting_and_a_tag(name: str) -> None:
    m = MITIGATIONS[name]
    model: dict[str, Any] = {"attn": DEFAULT_KIND, "registers": 0, name: m.example}
    assert list(variant_settings(model)) == [f"model.{name}"]
    assert (m.hub_tag or name.replace("_", "-")) in hub_tags(model)
    assert variant_settings({"attn": DEFAULT_KIND, "registers": 0}) == {}


def test_a_run_of_the_papers_recipe_has_no_notes_and_one_change_is_one_note(runs) -> None:
    recipe = OmegaConf.load(PAPER)
    assert recipe_notes(load_config(["exp=gate+reg", "recipe=paper"])) == []
    notes = recipe_notes(load_config(["exp=gate+reg", "recipe=paper", "train.epochs=3"]))
    assert notes == [("train.epochs", "3", shown(recipe.train.epochs))]


def test_the_default_runs_notes_name_the_recipes_settings(runs) -> None:
    recipe = OmegaConf.load(PAPER)
    notes = {k: (ours, theirs) for k, ours, theirs in recipe_notes(tiny_cfg(runs, "exp=gate+reg"))}
    assert notes["model.size"] == ("vit_cpu", recipe.defaults[0]["override /model"])
    assert notes["objective.lamb"] == ("0.05", shown(recipe.objective.lamb))
    assert notes["model.norm_eps"] == ("null", shown(recipe.model.norm_eps))
    assert notes["model.patch_size"] == (str(TINY_VIT["patch_size"]), shown(recipe.model.patch_size))
    default = {k: ours for k, ours, _ in recipe_notes(load_config(["exp=gate+reg"]))}  # vit_mini's sizes left null
    assert default["model.patch_size"] == f"{SIZES['vit_mini'].patch_size} (vit_mini's)"
    # every note is a setting the recipe file sets (its keys, or the model it picks)
    set_by_recipe = {f"{g}.{k}" for g, sub in recipe.items() if g != "defaults" for k in sub}
    assert set(notes) <= set_by_recipe | {"model.size"}
