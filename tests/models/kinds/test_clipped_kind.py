"""Clipped softmax (`vitsinks.models.kinds.clipped_softmax`) against rows computed by hand and a float64 hand loop,
its FlexAttention path against the explicit one (forward and gradients, float64 on CPU), its redirect (it moves the
sink's attention, it does not switch rows off) and the check's prediction from A, a head clipped to nothing read as
dead by the diagnostics, its settings and exp config, and a run of `exp=clipped_softmax` from the command line. The
kind-generic tests (tests/models/test_attention.py, test_fused_kinds.py, test_vit.py, tests/test_contract.py) run it
from the registry."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.commands import launch, run_module
from tests.helpers.tiny import TINY, tiny_vit
from vitsinks.configs.schema import load_config
from vitsinks.diagnostics import diagnose, summarize
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.interventions.edits import REDIRECT_TOL, check_redirect
from vitsinks.models import KINDS, SinkAttention, run_variant
from vitsinks.utils.errors import BadValue, ConfigError

clipped = KINDS["clipped_softmax"]
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def module(gamma: float | None = None, zeta: float | None = None, dim: int = 8, heads: int = 1) -> SinkAttention:
    """A clipped-softmax attention with these settings (None: the default)."""
    settings = {k: v for k, v in (("gamma", gamma), ("zeta", zeta)) if v is not None}
    torch.manual_seed(0)
    return SinkAttention(dim, heads, attn="clipped_softmax", kind_settings=settings, qkv_bias=True)


def hand_loop(s: torch.Tensor, gamma: float, zeta: float, causal: bool) -> torch.Tensor:
    """clip((zeta - gamma) exp(s_ij) / sum_k exp(s_ik) + gamma, 0, 1) entry by entry in float64, the sums over the
    keys a query sees; the others 0."""
    out = torch.zeros(s.shape, dtype=torch.float64)
    for idx in np.ndindex(*s.shape[:-1]):
        seen = idx[-1] + 1 if causal else s.shape[-1]
        row = [math.exp(float(x)) for x in s[idx][:seen]]
        for j, e in enumerate(row):
            out[idx + (j,)] = min(max((zeta - gamma) * e / sum(row) + gamma, 0.0), 1.0)
    return out


def test_rows_computed_by_hand() -> None:
    s = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))  # softmax 0.1, 0.2, 0.3, 0.4
    a = clipped.matrix(module(-0.2, 1.0), s, None)
    torch.testing.assert_close(a, torch.tensor([[0.0, 0.04, 0.16, 0.28]]))  # 1.2 p - 0.2, the first below 0
    b = clipped.matrix(module(-0.1, 1.5), torch.log(torch.tensor([[1.0, 9.0]])), None)
    torch.testing.assert_close(b, torch.tensor([[0.06, 1.0]]))  # 1.6 p - 0.1 = 0.06, 1.34 -> 1: the row sums to 1.06
    uniform = torch.zeros(1, 65)  # a [CLS] and 64 patches at a uniform start
    assert (clipped.matrix(module(-0.03), uniform, None) == 0).all()  # 1.03 / 65 - 0.03 < 0: every weight clipped
    default = clipped.matrix(module(), uniform, None)
    torch.testing.assert_close(default, torch.full((1, 65), 1.01 / 65 - 0.01))  # the default keeps every weight
    assert (default > 0).all() and default.sum() < 0.5


@pytest.mark.parametrize("causal", [False, True])
def test_float32_equals_a_float64_hand_loop_and_hidden_keys_weigh_nothing(causal: bool) -> None:
    gamma, zeta = -0.05, 1.2
    attn = module(gamma, zeta)
    s = 4 * torch.randn(2, 3, 9, 9, generator=torch.Generator().manual_seed(0))
    future = torch.ones(9, 9, dtype=torch.bool).triu(1) if causal else None
    a = clipped.matrix(attn, s, future)
    torch.testing.assert_close(a.double(), hand_loop(s, gamma, zeta, causal), atol=1e-6, rtol=1e-5)
    assert (a == 0).any() and (a == 1).any() and (a.sum(-1) > 1).any() and (a.sum(-1) < 1).any()  # both clips
    if future is not None:
        assert (a[..., future] == 0).all()  # gamma applies to the visible keys only: a hidden key weighs 0
    assert not clipped.normalised and clipped.sparse and clipped.flex and not clipped.signed


def edge_qkv(n: int = 65, d: int = 16) -> tuple[torch.Tensor, ...]:
    """float64 q, k, v (1, 2, n, d): query 0 scores every key 0 (uniform: clipped to nothing at gamma -0.03), query 1
    scores key 5 ~25 above the others (its weight clipped at 1), the others random."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    q[..., 0, :] = 0.0
    q[..., 1, :] = 25 * 4 * k[..., 5, :] / k[..., 5, :].square().sum(-1, keepdim=True)  # scale 1/4: score 25 at key 5
    return q, k, v


def explicit(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return clipped.matrix(attn, (q * attn.scale) @ k.transpose(-2, -1), None) @ v


def test_flexattention_equals_the_explicit_path_in_float64(cpu_flex_backward: None) -> None:
    attn = module(-0.03, 1.1, dim=32, heads=2).double()
    q, k, v = (t.requires_grad_() for t in edge_qkv())
    a = clipped.matrix(attn, (q * attn.scale) @ k.transpose(-2, -1), None)
    assert (a[..., 0, :] == 0).all() and (a[..., 1, 5] == 1).all() and (a == 0).float().mean() > 0.2
    fused, ref = clipped.flex_heads(attn, q, k, v), explicit(attn, q, k, v)
    assert fused.dtype == torch.float64 and (fused[..., 0, :] == 0).all()  # a row clipped to nothing: no output
    torch.testing.assert_close(fused, ref, atol=1e-12, rtol=0)
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grads = [torch.autograd.grad((out * g).sum(), [q, k, v]) for out in (clipped.flex_heads(attn, q, k, v),
                                                                       explicit(attn, q, k, v))]
    for gf, ge in zip(*grads, strict=True):
        assert torch.isfinite(gf).all()
        torch.testing.assert_close(gf, ge, atol=1e-12 * float(ge.abs().max()), rtol=0)


def strong_sink(attn: SinkAttention, lead: float) -> torch.Tensor:
    """Inputs (3 images, 6 tokens) on which the one head (8 wide) scores key 0 `lead` above the others, alike for
    every query: q = (1, ..., 1) and k = x, so s_ij = scale * sum(x_j), about N(0, 0.1) off key 0."""
    with torch.no_grad():
        w, b = attn.qkv.weight, attn.qkv.bias
        w[:8].zero_()
        b[:8].fill_(1.0)
        w[8:16].copy_(torch.eye(8))
        b[8:16].zero_()
    x = 0.3 * torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(3))
    x[:, 0] += lead / (8 * attn.scale)
    return x


def test_the_redirect_moves_the_sinks_attention_to_the_other_keys() -> None:
    attn = module(-0.03)
    x = strong_sink(attn, 40.0)
    sink = torch.zeros(3, dtype=torch.long)
    with torch.no_grad():
        a = attn.internals(x).attn[:, 0]
        red = attn.redirected(x, 0, sink)
        q, k, _ = attn._qkv(x)
        s = ((q @ k.transpose(-2, -1)) * attn.scale)[:, 0].double()
    assert (a[..., 0] > 0.999).all() and (a[..., 1:] == 0).all()  # every weight off the sink clipped to 0
    p = s[..., 1:].softmax(-1)  # the softmax over the other keys, stretched and clipped: by hand
    truth = torch.cat([torch.zeros(3, 6, 1, dtype=torch.float64), (1.03 * p - 0.03).clamp(0, 1)], dim=-1)
    torch.testing.assert_close(red.double(), truth, atol=1e-6, rtol=1e-5)
    assert (red.sum(-1) > 0.5).all()  # moved, not switched off
    for b in range(3):  # the float64 twin, row by row
        for i in range(6):
            twin = clipped.reference_redirected(attn, s[b, i], 0, 6, 0)
            torch.testing.assert_close(twin, truth[b, i], atol=1e-12, rtol=0)
    _, rows = clipped.expected_redirect(attn, a, sink)
    assert not rows.any()  # A holds none of these rows' softmax (every weight off the sink is clipped)


def test_the_checks_prediction_from_a_holds_on_the_rows_nothing_is_clipped_on() -> None:
    attn = module(-0.01, 1.05)
    x = strong_sink(attn, 2.0)  # a mild lead: the rows keep every weight
    x[2] = torch.randn(6, 8, generator=torch.Generator().manual_seed(4)) * 30  # image 2: sharp rows, weights clipped
    sink = torch.tensor([0, 3, 0])
    with torch.no_grad():
        a = attn.internals(x).attn[:, 0]
        red = attn.redirected(x, 0, sink)
    expected, rows = clipped.expected_redirect(attn, a, sink)
    unclipped = ((a > 0) & (a < 1)).all(-1)
    assert torch.equal(rows, unclipped) and rows[:2].all() and not rows[2].any()
    torch.testing.assert_close(expected[rows], red.double()[rows], atol=1e-6, rtol=1e-5)
    err, checked = check_redirect(a, red, sink, attn)
    assert err < 1e-5 and checked == 12
    with torch.no_grad():
        attn.qkv.bias[:8] *= 1.5  # other queries than A's
        assert check_redirect(a, attn.redirected(x, 0, sink), sink, attn)[0] > REDIRECT_TOL


def test_a_block_clipped_to_nothing_reads_dead_with_no_sink_event() -> None:
    """64 patches + [CLS]: block 0 scores every key alike (q = k = 0), so at gamma -0.03 all its weights are clipped
    to 0 (as every head of a freshly initialised model at that gamma: its scores are all near 0); at the default
    gamma the same block attends to every key. Block 1's queries are sharpened: some of its keys stand out."""
    images = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    for gamma, dead in ((-0.03, True), (None, False)):
        model = tiny_vit(attn="clipped_softmax", kind_settings={} if gamma is None else {"gamma": gamma}).eval()
        with torch.no_grad():
            model.blocks[0].attn.qkv.weight[:96].zero_()  # the queries and keys of block 0 (embed_dim 48)
            model.blocks[0].attn.qkv.bias[:96].zero_()
            model.blocks[1].attn.qkv.weight[:48].mul_(30.0)
        d = diagnose(model, images)
        assert d["dead"].shape == (4, 2, 3) and (d["dead"][:, 0] == float(dead)).all()
        assert (d["dead"][:, 1] == 0).all()
        summary = summarize(d)
        strongest = summary["strongest_head_by_block"]["location"]
        assert (strongest[0] == "dead") == dead and strongest[1] != "dead"
        assert summary["head_shape"]["dead_by_block"][0] == (1.0 if dead else 0.0)
        if dead:
            assert not SinkRules().events(d)[:, 0].any() and (d["mass"][:, 0] == 0).all()


def test_the_settings_are_checked_listed_in_the_exp_file_and_name_the_variant() -> None:
    cfg = load_config(["exp=clipped_softmax"])
    assert cfg.model.attn == "clipped_softmax" and run_variant(cfg) == "clipped_softmax"
    assert dict(cfg.model.kind_settings) == dataclasses.asdict(clipped.Settings())  # every setting, its default
    tuned = load_config(["exp=clipped_softmax", "model.kind_settings.gamma=-0.03", "model.registers=4"])
    assert run_variant(tuned) == "clipped_softmax(gamma=-0.03)+reg"
    for bad in ("model.kind_settings.gamma=0.1", "model.kind_settings.zeta=0.5"):
        with pytest.raises(ConfigError, match="clipped_softmax needs gamma <= 0 and zeta >= 1"):
            load_config(["exp=clipped_softmax", bad])
    with pytest.raises(BadValue, match="gamma <= 0 and zeta >= 1"):
        clipped.settings({"zeta": 0.9})


@pytest.mark.slow
def test_exp_clipped_softmax_trains_diagnoses_probes_and_reaches_the_leaderboard(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fast = ["diagnostics.enabled=true", "diagnostics.n_images=4", "diagnostics.plots=false", "diagnostics.report=false",
            "eval.after_train=true", "eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1",
            "eval.linear_lrs=[0.01]", "eval.dense_epochs=1"]
    out = launch("exp=clipped_softmax", *TINY, *fast, f"runs_dir={runs}", "name=clip", "train.max_steps=3")
    assert out.returncode == 0, out.stderr[-3000:]
    run = runs / "clip"
    losses = [m["loss"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in m]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    summary = json.loads((run / "diagnostics" / "final" / "summary.json").read_text())
    assert summary["head_shape"]["dead_by_block"] == [0.0, 0.0]  # the default gamma: every head attends
    assert (run / "results" / "linear.json").is_file()
    board = run_module("vitsinks.leaderboard", f"runs={runs}")
    assert board.returncode == 0, board.stderr[-3000:]
    assert "clipped_softmax" in (runs / "leaderboard" / "leaderboard.md").read_text()
