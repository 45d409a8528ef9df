"""The synthetic tasks train, seeded, and the diagnostics classify each case as the task guarantees."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers.commands import run_command, run_module
from vitsinks.sinktasks import run_broadcast, run_nop, run_trigger
from vitsinks.sinktasks.figures import FIGURES
from vitsinks.sinktasks.pathway_task import (
    ARMS,
    BroadcastToy,
    build_arm,
    evaluate_arm,
    evaluate_batch,
    pathway_targets,
    summed_penalty,
    task_constants,
    train_arm,
    training_loss,
    without_pathway,
)


@pytest.mark.slow
def test_trigger_softmax_sinks_on_bos_relu_does_not() -> None:
    r = run_trigger(steps=700, seed=0)["models"]
    for heads in (1, 4):
        soft, relu = r[f"softmax_{heads}h"], r[f"relu_{heads}h"]
        assert soft["bos_attention_nontrigger_max_head"] >= 0.9
        assert relu["bos_attention_nontrigger"] <= 0.05
        # comparable task error: both solve it (relative error well under 5%)
        assert soft["task_rel_error"] < 0.05 and relu["task_rel_error"] < 0.05


@pytest.mark.slow
def test_nop_task_makes_a_nop_sink_on_bos_with_a_qk_spike_and_control_does_not() -> None:
    m = run_nop(steps=800, seed=0)["models"]
    damp, ctrl = m["damping"], m["control"]
    assert damp["sink_on_bos_rate"] >= 0.8 and damp["nop_rate"] == damp["sink_event_rate"]
    assert damp["ratio_out"] <= 0.2
    assert ctrl["sink_event_rate"] == 0.0
    assert damp["qk_sigma1_frac"] > 1.5 * ctrl["qk_sigma1_frac"]
    assert damp["qk_sigma1_over_sigma2"] > 2 * ctrl["qk_sigma1_over_sigma2"]


@pytest.mark.slow
def test_broadcast_task_hub_is_classified_broadcast() -> None:
    r = run_broadcast(steps=800, seed=0)
    assert r["hub_event_rate"] >= 0.9 and r["hub_on_source_rate"] >= 0.9
    assert r["hub_broadcast_rate"] >= 0.9
    assert r["hub_ratio_out"] >= 0.5 and r["hub_stable_rank"] <= 1.5


@pytest.mark.slow
def test_cli_writes_json_and_figure(tmp_path: Path, figures: list) -> None:
    out = run_command([sys.executable, "-m", "vitsinks.synthetic", "task=broadcast", "steps=300",
                          f"out={tmp_path}"])
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "broadcast.json").read_text())["task"] == "broadcast"
    assert (tmp_path / "broadcast.png").stat().st_size > 10_000
    r = json.loads((tmp_path / "broadcast.json").read_text())
    FIGURES["broadcast"](r, tmp_path / "again.png")  # the panels are the result's attention maps, hub marked
    drawn = [ax.images[0].get_array() for ax in figures[-1].axes if ax.images]
    expected = [np.asarray(m)[h] for m in r["attention_example"] for h in range(np.asarray(m).shape[0])]
    assert len(drawn) == len(expected) and all(np.array_equal(d, e) for d, e in zip(drawn, expected, strict=True))
    assert sum("(hub)" in ax.get_title() for ax in figures[-1].axes) == 1
    bad = run_module("vitsinks.synthetic", "task=nope")
    assert bad.returncode == 1 and "unknown task" in bad.stderr


def _layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, 1e-5)


def _hand_forward(model: BroadcastToy, x: torch.Tensor, remove_layer2: str | None = None
                  ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The task's model written out from its weights: z = LN(x + p) in layer 1 (p nowhere else), one bias-free
    softmax head, the pathway beside it, then x + MLP(x) with LN -> Linear(64, 256) -> GELU -> Linear(256, 64).
    Returns the output and each layer's attention update W_O A V; `remove_layer2` zeroes layer 2's "attention" or
    "pathway" update."""
    h, updates = x, []
    for layer, blk in enumerate(model.blocks):
        if layer == 0:
            z = _layer_norm(h + blk.norm1.pos, blk.norm1.norm)
        else:
            z = _layer_norm(h, blk.norm1)
        wq, wk, wv = blk.attn.qkv.weight.chunk(3)
        A = ((z @ wq.T) @ (z @ wk.T).transpose(1, 2) / 8.0).softmax(-1)
        o = (A @ (z @ wv.T)) @ blk.attn.proj.weight.T
        updates.append(o)
        gp = blk.pathway(z) if blk.pathway is not None else torch.zeros_like(o)
        if layer == 1 and remove_layer2 == "attention":
            o = torch.zeros_like(o)
        if layer == 1 and remove_layer2 == "pathway":
            gp = torch.zeros_like(gp)
        h = h + o + gp
        m = F.gelu(F.linear(_layer_norm(h, blk.norm2), blk.mlp.fc1.weight, blk.mlp.fc1.bias))
        h = h + F.linear(m, blk.mlp.fc2.weight, blk.mlp.fc2.bias)
    return h, updates


def _hand_targets(x: torch.Tensor, seed: int) -> torch.Tensor:
    """y_i = x_i + x_{j*} R, j* = argmax_j <x_j, u>; u, R from a generator seeded 2000 + seed, drawn as stated."""
    g = torch.Generator().manual_seed(2000 + seed)
    u = torch.randn(64, generator=g)
    u = u / u.norm()
    R = torch.linalg.qr(torch.randn(64, 64, generator=g)).Q
    return torch.stack([xb + xb[(xb @ u).argmax()] @ R for xb in x])


def _boost_pathways(model: BroadcastToy) -> None:
    """Scale the pathways' output maps up so that their share of an untrained model's output is not negligible."""
    with torch.no_grad():
        for blk in model.blocks:
            blk.pathway.out.weight.mul_(100.0)


def test_broadcast_pathway_task_constants_and_batches_come_from_the_stated_generators() -> None:
    for seed in (0, 3):
        u, R = task_constants(seed)
        g = torch.Generator().manual_seed(2000 + seed)
        u_hand = torch.randn(64, generator=g)
        assert torch.equal(u, u_hand / u_hand.norm()) and abs(float(u.norm()) - 1) < 1e-6
        assert torch.equal(R, torch.linalg.qr(torch.randn(64, 64, generator=g)).Q)
        assert torch.allclose(R @ R.T, torch.eye(64), atol=1e-5)
        x = torch.randn(5, 32, 64, generator=torch.Generator().manual_seed(7))
        assert torch.allclose(pathway_targets(x, u, R), _hand_targets(x, seed), atol=1e-6)
    assert not torch.equal(task_constants(0)[1], task_constants(1)[1])
    # training: the first step's MSE is that of the untrained model on the first batch of generator 1000 + seed
    seed = 2
    x = torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(1000 + seed))
    with torch.no_grad():
        first = float(((_hand_forward(build_arm("global", seed), x)[0] - _hand_targets(x, seed)) ** 2).mean())
    _, curve = train_arm("global", seed, steps=1, batch=8, lr=1e-3)
    assert abs(curve[0] - first) < 1e-5 * first
    # evaluation: batches 0 and 2 of generator 5000 + seed (1 and 3 are the skipped donor batches)
    model = build_arm("global", seed)
    stream = torch.Generator().manual_seed(5000 + seed)
    xs = [torch.randn(16, 32, 64, generator=stream) for _ in range(4)][::2]
    with torch.no_grad():
        mse = np.mean([float(((_hand_forward(model, xe)[0] - _hand_targets(xe, seed)) ** 2).mean()) for xe in xs])
    assert abs(evaluate_arm(model, seed, n_batches=2, batch=16)["mse"] - mse) < 1e-5 * mse


def test_broadcast_pathway_arms_share_their_initial_parameters() -> None:
    attention, glob, pen = (build_arm(arm, 4).state_dict() for arm in ARMS)
    assert set(glob) == set(pen) and all(torch.equal(glob[k], pen[k]) for k in glob)
    assert set(attention) < set(glob) and all(torch.equal(attention[k], glob[k]) for k in attention)
    assert all(".pathway." in k for k in set(glob) - set(attention))
    other = build_arm("attention", 5).state_dict()
    assert not torch.equal(other["blocks.0.attn.qkv.weight"], attention["blocks.0.attn.qkv.weight"])


def test_broadcast_pathway_model_is_the_stated_architecture() -> None:
    model = build_arm("global", 0)
    params = dict(model.named_parameters())
    assert [k for k in params if "pos" in k] == ["blocks.0.norm1.pos"]  # layer 1's pre-norm only
    assert params["blocks.0.norm1.pos"].shape == (32, 64)
    for blk in model.blocks:
        assert blk.attn.num_heads == 1 and blk.attn.qkv.bias is None and blk.attn.proj.bias is None
        assert blk.attn.proj.weight.shape == (64, 64)
        assert blk.mlp.fc1.weight.shape == (256, 64) and blk.mlp.fc2.weight.shape == (64, 256)
        assert blk.mlp.fc1.bias is not None and blk.mlp.fc2.bias is not None
        assert blk.pathway is not None
    _boost_pathways(model)
    with torch.no_grad():
        model.blocks[0].norm1.pos.normal_()  # large enough to matter (the hand forward adds it to layer 1's z only)
        x = torch.randn(3, 32, 64, generator=torch.Generator().manual_seed(1))
        assert torch.allclose(model(x), _hand_forward(model, x)[0], atol=1e-4)


def test_broadcast_pathway_model_cannot_see_a_tokens_mean_over_features() -> None:
    """Every attention, pathway and MLP reads a LayerNorm of its input, which subtracts the token's mean over
    features: adding c * (1, ..., 1) to one input token moves that token's output by exactly c * (1, ..., 1) and
    nothing else. So the selector's component along the all-ones direction is invisible to the model."""
    model = build_arm("global", 0)
    _boost_pathways(model)
    x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(5))
    shifted = x.clone()
    shifted[:, 5] += 3.0
    expected = torch.zeros_like(x)
    expected[:, 5] = 3.0
    with torch.no_grad():
        assert torch.allclose(model(shifted) - model(x), expected, atol=1e-4)


def test_broadcast_pathway_penalty_is_the_sum_over_the_two_layers() -> None:
    model = build_arm("global+pen", 1)
    x = torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(2))
    y = _hand_targets(x, 1)
    loss, mse = training_loss(model, x, y, cm_penalty=1.5)
    with torch.no_grad():
        out, updates = _hand_forward(model, x)
    pens = [float((o.mean(1) ** 2).mean() / ((o**2).mean() + 1e-12)) for o in updates]
    assert all(0 < p < 1 for p in pens)
    assert abs(mse.item() - float(((out - y) ** 2).mean())) < 1e-5
    assert abs(summed_penalty(model).item() - sum(pens)) < 1e-5
    assert abs(loss.item() - (mse.item() + 1.5 * sum(pens))) < 1e-5
    plain, _ = training_loss(model, x, y, cm_penalty=None)
    assert torch.equal(plain, mse)
    summed_penalty(model).backward()  # gradients reach both layers' attention
    assert all(float(blk.attn.qkv.weight.grad.abs().sum()) > 0 for blk in model.blocks)


def test_broadcast_pathway_removals_edit_layer_2_only() -> None:
    model = build_arm("global", 3)
    _boost_pathways(model)
    x = torch.randn(6, 32, 64, generator=torch.Generator().manual_seed(4))
    y = _hand_targets(x, 3)
    r = evaluate_batch(model, x, y)
    with torch.no_grad():
        def hand_mse(remove: str | None) -> float:
            return float(((_hand_forward(model, x, remove)[0] - y) ** 2).mean())
        base = hand_mse(None)
        assert abs(r["mse"] - base) < 1e-5 * base
        for key, what in (("d_mse_no_attention_layer2", "attention"), ("d_mse_no_pathway_layer2", "pathway")):
            assert abs(r[key] - (hand_mse(what) - base)) < 1e-4 * base, key
        with without_pathway(model.blocks[0]), without_pathway(model.blocks[1]):  # a different, measurable edit
            without_both = float(((model(x) - y) ** 2).mean()) - base
        assert abs(without_both - r["d_mse_no_pathway_layer2"]) > 1e-2 * abs(r["d_mse_no_pathway_layer2"])
    assert model.blocks[0].pathway is not None and model.blocks[1].pathway is not None  # restored
    assert "d_mse_no_pathway_layer2" not in evaluate_batch(build_arm("attention", 3), x, y)


@pytest.mark.slow
def test_broadcast_pathway_cli_writes_json_and_figure(tmp_path: Path) -> None:
    out = run_command([sys.executable, "-m", "vitsinks.synthetic", "task=broadcast_pathway", "steps=2",
                          "n_seeds=1", "batch=8", "lr=1e-3", f"out={tmp_path}"])
    assert out.returncode == 0, out.stderr
    r = json.loads((tmp_path / "broadcast_pathway.json").read_text())
    assert (r["steps"], r["batch"], r["lr"], r["n_seeds"], r["device"]) == (2, 8, 1e-3, 1, "cpu")
    assert set(r["arms"]) == set(ARMS) and all(len(r["per_seed"][a]) == 1 for a in ARMS)
    assert r["reference_recipe"]["steps"] == 30_000 and r["reference_recipe"]["batch"] == 1024
    assert (tmp_path / "broadcast_pathway.png").stat().st_size > 10_000


@pytest.mark.slow
def test_pathway_options_belong_to_that_task_only(tmp_path: Path) -> None:
    bad = run_module("vitsinks.synthetic", "task=nop", "n_seeds=2", f"out={tmp_path}")
    assert bad.returncode == 1 and "broadcast_pathway only" in bad.stderr


class _RefLayer(torch.nn.Module):
    """The reference toy's attention layer as its paper states it: pre-norm, bias-free W_q, W_k, W_v, W_o (one head of
    width d), a learned position embedding N(0, 1) * 0.02 added before layer 1's norm only."""

    def __init__(self, d: int, length: int, pos: bool) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.Wq, self.Wk, self.Wv, self.Wo = (torch.nn.Linear(d, d, bias=False) for _ in range(4))
        self.pos = torch.nn.Parameter(torch.randn(length, d) * 0.02) if pos else None


class _RefPathway(torch.nn.Module):
    """The reference's global pathway: pooling w_P, state value W_VG, state output W_OG and a biased recipient gate,
    created in that order, then each weight re-initialised trunc-normal std 0.02 in that order, the gate bias 0."""

    def __init__(self, d: int, state: int) -> None:
        super().__init__()
        self.w_P = torch.nn.Linear(d, 1, bias=False)
        self.W_VG = torch.nn.Linear(d, state, bias=False)
        self.W_OG = torch.nn.Linear(state, d, bias=False)
        self.gate = torch.nn.Linear(d, 1)
        for m in (self.w_P, self.W_VG, self.W_OG, self.gate):
            torch.nn.init.trunc_normal_(m.weight, std=0.02)
        torch.nn.init.zeros_(self.gate.bias)


def _reference_toy(seed: int, pathway: bool, d: int = 64, length: int = 32) -> dict[str, torch.Tensor]:
    """The reference toy's parameters after `torch.manual_seed(seed)`: layer 1, MLP 1, layer 2, MLP 2 (LN -> Linear
    d->4d -> GELU -> Linear 4d->d), then the pathways of layers 1 and 2; mapped onto vitsinks' parameter names."""
    torch.manual_seed(seed)
    mlp = lambda: torch.nn.Sequential(torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.GELU(),  # noqa: E731
                                      torch.nn.Linear(4 * d, d))
    l1, m1, l2, m2 = _RefLayer(d, length, True), mlp(), _RefLayer(d, length, False), mlp()
    out: dict[str, torch.Tensor] = {"blocks.0.norm1.pos": l1.pos}
    for i, (lay, m) in enumerate(((l1, m1), (l2, m2))):
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([lay.Wq.weight, lay.Wk.weight, lay.Wv.weight])
        out[f"blocks.{i}.attn.proj.weight"] = lay.Wo.weight
        for name, lin in (("fc1", m[1]), ("fc2", m[3])):
            out[f"blocks.{i}.mlp.{name}.weight"], out[f"blocks.{i}.mlp.{name}.bias"] = lin.weight, lin.bias
    if pathway:
        for i in range(2):
            gp = _RefPathway(d, 64)
            out[f"blocks.{i}.pathway.inp.weight"] = torch.cat([gp.w_P.weight, gp.gate.weight, gp.W_VG.weight])
            out[f"blocks.{i}.pathway.out.weight"] = gp.W_OG.weight
            out[f"blocks.{i}.pathway.gamma_bias"] = gp.gate.bias
    return {k: v.detach() for k, v in out.items()}


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("arm", ARMS)
def test_broadcast_pathway_initial_parameters_are_the_references_seed_for_seed(arm: str, seed: int) -> None:
    ours = build_arm(arm, seed).state_dict()
    ref = _reference_toy(seed, pathway=arm != "attention")
    drawn = {k for k in ours if not k.endswith(("norm.weight", "norm.bias", "norm1.weight", "norm1.bias",
                                                   "norm2.weight", "norm2.bias"))}
    assert drawn == set(ref)  # every drawn parameter is compared
    for k in ref:
        assert torch.equal(ours[k], ref[k]), k
