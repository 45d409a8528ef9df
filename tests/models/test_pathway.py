"""The global pathway and the common-mode penalty (SPEC section 7) against hand computations, in the ViT builder, the
trainer and the diagnostics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers.tiny import tiny_cfg
from vitsinks.configs.schema import ObjectiveConfig, load_config
from vitsinks.diagnostics import diagnose, summarize
from vitsinks.models import GlobalPathway, build_vit, common_mode_penalty, load_timm_state_dict, model_from_config
from vitsinks.objectives.penalty import CommonModePenalty
from vitsinks.train.trainer import Trainer


@pytest.mark.parametrize("gate", ["learned", "hier"])
def test_pathway_forward_equals_the_spec_equations_by_hand(gate: str) -> None:
    torch.manual_seed(0)
    pw = GlobalPathway(6, state_dim=3, gate=gate, init_values=0.5)
    for p in pw.parameters():  # away from the init, so every term matters
        torch.nn.init.normal_(p)
    z = torch.randn(2, 5, 6)
    pw.requires_grad_(False)
    w_p, w_vg, w_og = pw.w_pool, pw.w_value, pw.out.weight
    w_g, b_g = pw.w_gamma, pw.gamma_bias

    def sigmoid(t: float) -> float:
        return 1 / (1 + math.exp(-t))

    for b in range(2):
        scores = [float(w_p @ z[b, j]) for j in range(5)]
        pi = [math.exp(s) / sum(math.exp(t) for t in scores) for s in scores]
        g = sum(pi[j] * (w_vg @ z[b, j]) for j in range(5))
        for i in range(5):
            logits = [float(w_g[k] @ z[b, i] + b_g[k]) for k in range(len(b_g))]
            if gate == "learned":  # sigmoid(w_gamma . z_i + b_gamma)
                gamma = sigmoid(logits[0])
            else:  # [a, r0, rbc] = Linear(D, 3)(z_i); gamma = sigmoid(a) * exp(rbc) / (exp(r0) + exp(rbc))
                a, r0, rbc = logits
                gamma = sigmoid(a) * math.exp(rbc) / (math.exp(r0) + math.exp(rbc))
            want = pw.ls3.gamma * gamma * (w_og @ g)
            assert torch.allclose(pw(z)[b, i], want, atol=1e-5)


def test_pathway_init_follows_the_spec() -> None:
    torch.manual_seed(0)
    model = build_vit("vit_cpu", depth=2, global_pathway={"state_dim": 64})
    pw = model.blocks[0].pathway
    assert pw.inp.bias is None and pw.out.bias is None  # no biases in w_P, W_VG, W_OG
    assert pw.w_value.shape == (64, 192) and abs(float(pw.w_value.detach().std()) - 0.02) < 0.003
    assert pw.gamma_bias.abs().max() == 0  # gamma = 0.5 at init
    z = torch.randn(1, 4, 192) * 0.01
    assert torch.allclose(pw.internals(z).gamma, torch.full((1, 4, 1), 0.5), atol=1e-3)
    hier = build_vit("vit_cpu", depth=1, global_pathway={"gate": "hier"}).blocks[0].pathway
    assert hier.gamma_bias.shape == (3,) and hier.w_gamma.shape == (3, 192)  # one Linear(D, 3), bias 0
    assert torch.allclose(hier.internals(z).gamma, torch.full((1, 4, 1), 0.25), atol=1e-3)  # 0.5 * 0.5 at init


def test_penalty_equals_its_formula_on_hand_made_updates() -> None:
    same = torch.randn(3, 1, 8).expand(3, 7, 8)  # the same update at every token
    assert math.isclose(float(common_mode_penalty(same)), 1.0, rel_tol=1e-6)
    centred = torch.randn(3, 7, 8)
    centred = centred - centred.mean(1, keepdim=True)  # zero mean over tokens
    assert float(common_mode_penalty(centred)) < 1e-12
    o = torch.tensor([[[1.0, 0.0], [3.0, 2.0]]])  # token mean (2, 1); E(mean) = 2.5, E(o) = 14 / 4
    assert math.isclose(float(common_mode_penalty(o)), 2.5 / 3.5, rel_tol=1e-6)


def test_gradients_reach_every_pathway_weight_and_the_gate_through_the_penalty() -> None:
    torch.manual_seed(0)
    model = build_vit("vit_cpu", img_size=32, depth=2, gate="elementwise", global_pathway={"gate": "hier"})
    penalty = CommonModePenalty(model.blocks, ObjectiveConfig(cm_penalty=1.0))
    out = model(torch.randn(2, 3, 32, 32)).square().mean()
    extra, terms = penalty()
    (out + extra).backward()
    pw = model.blocks[1].pathway
    grad = pw.inp.weight.grad
    for rows in (grad[0], grad[1:4], grad[4:]):  # w_P, the hier gate's three logits, W_VG
        assert rows.abs().sum() > 0
    for p in (pw.out.weight, pw.gamma_bias, model.blocks[1].attn.gate.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert set(terms) == {"cm_penalty", "cm/block0", "cm/block1"} and 0 < float(terms["cm_penalty"].detach()) <= 2
    attn_only = build_vit("vit_cpu", img_size=32, depth=2, gate="elementwise")
    penalty = CommonModePenalty(attn_only.blocks, ObjectiveConfig(cm_penalty=1.0, cm_pre_gate=True))
    attn_only(torch.randn(2, 3, 32, 32))
    penalty()[0].backward()  # the penalty alone trains attention: the qkv weights get its gradient
    assert attn_only.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_the_penalty_is_the_mean_over_the_penalised_blocks_of_a_hand_computed_ratio() -> None:
    torch.manual_seed(0)
    model = build_vit("vit_cpu", img_size=32, depth=3, layerscale_init=0.5)
    updates: list[torch.Tensor] = []  # ls1 * attn(norm1(x)) of every block, recomputed from the block's input
    hooks = [blk.register_forward_pre_hook(lambda m, a: updates.append(m.ls1(m.attn(m.norm1(a[0])))))
             for blk in model.blocks]
    penalty = CommonModePenalty(model.blocks, ObjectiveConfig(cm_penalty=0.3, cm_skip_blocks=1))
    model(torch.randn(2, 3, 32, 32))
    extra, terms = penalty()
    for h in hooks:
        h.remove()

    def ratio(o: torch.Tensor) -> float:  # E(mean_i o_i) / (E(o) + 1e-12), E the mean squared entry
        o = o.detach().double()
        return float(o.mean(dim=1).pow(2).mean() / (o.pow(2).mean() + 1e-12))

    by_hand = [ratio(o) for o in updates]
    assert all(math.isclose(float(terms[f"cm/block{i}"].detach()), by_hand[i], rel_tol=1e-4) for i in range(3))
    want = 0.3 * (by_hand[1] + by_hand[2]) / 2  # block 0 skipped; the MEAN of the others, not their sum
    assert math.isclose(float(extra), want, rel_tol=1e-4)


# The reference's run flags (its run script) and the vitsinks fields they map to; every pathway / penalty exp config
# must carry them. None = no LayerScale on the pathway ("--gp_ls_init none").
REFERENCE_FLAGS = {
    "global+pen": {"--gp_state_dim 64": ("model.global_pathway.state_dim", 64),
                   "--gp_ls_init none": ("model.global_pathway.layerscale_init", None),
                   "--ls_init 1": ("model.layerscale_init", 1.0),
                   "--cm_penalty 0.1": ("objective.cm_penalty", 0.1),
                   "--cm_skip_layers 1": ("objective.cm_skip_blocks", 1),
                   "(no --gp_gate)": ("model.global_pathway.gate", "learned"),
                   "(no --cm_pre_gate)": ("objective.cm_pre_gate", False),
                   "(no --gating)": ("model.gate", "none")},
}
REFERENCE_FLAGS["gate+global+pen"] = {**REFERENCE_FLAGS["global+pen"],
                                      "--gating elementwise": ("model.gate", "elementwise"),
                                      "--gp_gate hier": ("model.global_pathway.gate", "hier"),
                                      "--cm_pre_gate": ("objective.cm_pre_gate", True)}
del REFERENCE_FLAGS["gate+global+pen"]["(no --gp_gate)"], REFERENCE_FLAGS["gate+global+pen"]["(no --cm_pre_gate)"]
del REFERENCE_FLAGS["gate+global+pen"]["(no --gating)"]


@pytest.mark.parametrize("exp", sorted(REFERENCE_FLAGS))
@pytest.mark.parametrize("recipe", [[], ["recipe=paper"]])
def test_pathway_exp_configs_carry_the_reference_run_flags(exp: str, recipe: list[str]) -> None:
    cfg = load_config([f"exp={exp}", *recipe])
    for flag, (key, want) in REFERENCE_FLAGS[exp].items():
        got = OmegaConf.select(cfg, key)
        assert (got == want) if want is not None else got is None, f"{exp}: {flag} -> {key}={got}, want {want}"
    assert cfg.model.global_pathway.enabled


def test_a_timm_state_dict_still_loads_and_the_pathway_is_part_of_the_recomputation_check() -> None:
    torch.manual_seed(0)
    plain = build_vit("vit_cpu", img_size=32, depth=2)
    load_timm_state_dict(build_vit("vit_cpu", img_size=32, depth=2), plain.state_dict())
    model = build_vit("vit_cpu", img_size=32, depth=2, global_pathway={"state_dim": 16})
    x = torch.randn(2, 3, 32, 32)
    d = diagnose(model, x)
    assert d["recompute_error"].max() < 1e-5
    with torch.no_grad():  # the explicit block = attention + pathway: without the pathway it would not match
        blk, h = model.blocks[0], model.embed_tokens(x)
        it = blk.attn.internals(blk.norm1(h))
        no_pathway = h + blk.ls1(blk.attn.combine(it.attn @ it.v, it.gate))
        assert (blk(h) - no_pathway).abs().max() > 1e-4
    s = summarize(d)
    assert len(s["pathway"]["share_by_block"]) == 2 and all(0 < v < 1 for v in s["pathway"]["share_by_block"])
    assert all(0 <= v <= 1 for v in s["common_mode_by_block"])
    assert all(0 < e <= math.log(model.tokens_per_image()) + 1e-6 for e in s["pathway"]["entropy_by_block"])


def _terms(run: Path, key: str) -> list[float]:
    return [r[key] for r in (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
            if key in r]


@pytest.mark.slow
def test_global_pen_trains_logs_the_penalty_per_block_and_resumes_exactly(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "exp=global+pen", "name=straight")).fit()

    def stop(tr: Trainer) -> None:
        if tr.progress.step == 3:
            tr.request_stop()

    assert Trainer(tiny_cfg(runs, "exp=global+pen", "name=resumed")).fit(on_step=stop)["status"] == "interrupted"
    assert Trainer(tiny_cfg(runs, "exp=global+pen", "name=resumed")).fit()["status"] == "finished"
    for key in ("loss", "cm_penalty", "cm/block0", "cm/block1"):
        straight = _terms(runs / "straight", key)
        assert len(straight) == 8 and straight == _terms(runs / "resumed", key)  # exact, every step
    assert all(0 < v <= 2 for v in _terms(runs / "straight", "cm_penalty"))


def test_every_new_variant_builds_from_its_config() -> None:
    for exp, gated, regs in (("global", False, 0), ("gate+global+pen", True, 0), ("reg+global+pen", False, 4)):
        cfg = load_config([f"exp={exp}", "model.depth=2"])
        model = model_from_config(cfg.model)
        assert all(b.pathway is not None for b in model.blocks)
        assert (model.blocks[0].attn.gate is not None) == gated and model.num_reg_tokens == regs
        assert (cfg.objective.cm_penalty > 0) == exp.endswith("+pen")


def test_the_penalty_is_the_references_ratio_bit_for_bit_and_within_1e7_of_float64() -> None:
    """The reference's Eq.-5 ratio, transcribed: E(mean_i o_i) / (E(o) + 1e-12) with E the mean of squares."""
    gen = torch.Generator().manual_seed(0)
    o = torch.randn(64, 128, 64, generator=gen) * 3 + torch.randn(64, 1, 64, generator=gen)  # 524k entries
    reference = o.mean(dim=1).pow(2).mean() / (o.pow(2).mean() + 1e-12)
    assert torch.equal(common_mode_penalty(o), reference)
    exact = o.double().mean(dim=1).pow(2).mean() / (o.double().pow(2).mean() + 1e-12)
    assert abs(float(common_mode_penalty(o)) / float(exact) - 1) < 1e-7
