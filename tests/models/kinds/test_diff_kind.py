"""Differential attention (`vitsinks.models.kinds.diff`) against hand loops in float64 (the two maps of the split
halves, lambda, the per-head RMSNorm), closed-form rows, its SDPA path against the explicit one (forward and
gradients), its redirect against the float64 twin, how the diagnostics read its signed heads (planted), and from the
command line: trained, diagnosed, probed, on the leaderboard and intervened on (the redirect check covers no row).
The kind-generic checks run for it from the registry (tests/test_contract.py, tests/models/)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.commands import run_module
from tests.helpers.strong_sink import plant_cls_sink
from tests.helpers.tiny import TINY, tiny_vit
from vitsinks.configs.schema import load_config
from vitsinks.diagnostics import diagnose_tokens
from vitsinks.interventions.edits import check_redirect
from vitsinks.models import KINDS, SinkAttention, SinkBlock, build_vit, run_variant
from vitsinks.train.checkpoint import backbone_from_state, load, save_state
from vitsinks.utils.errors import BadValue

diff = KINDS["diff"]


def lambda_by_hand(attn: SinkAttention) -> float:
    """exp(lq1 . lk1) - exp(lq2 . lk2) + 0.8 - 0.6 exp(-0.3 (l - 1)), l the 1-based block (the paper's formula)."""
    dots = [sum(a * b for a, b in zip(getattr(attn, f"lambda_q{m}").tolist(), getattr(attn, f"lambda_k{m}").tolist(),
                                      strict=True)) for m in (1, 2)]
    return math.exp(dots[0]) - math.exp(dots[1]) + 0.8 - 0.6 * math.exp(-0.3 * ((attn.block + 1) - 1))


@torch.no_grad()
def naive_forward(attn: SinkAttention, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The module's output in float64 from its weights, one image, head, query, key and channel at a time."""
    B, N, C = x.shape
    H, lam = attn.num_heads, lambda_by_hand(attn)
    d = C // H
    half = d // 2
    W, bias = attn.qkv.weight.double(), attn.qkv.bias.double()
    norm_w = attn.head_norm_weight.double()
    out = torch.zeros(B, N, C, dtype=torch.float64)
    for b in range(B):
        qkv = x[b].double() @ W.T + bias
        for h in range(H):
            q, k, v = (qkv[:, j * C + h * d : j * C + (h + 1) * d] for j in range(3))
            for i in range(N):
                keys = range(i + 1) if causal else range(N)
                maps = []
                for m in (0, 1):  # map m reads channels m * half .. (m + 1) * half of the head
                    s = [sum(q[i, m * half + c] * k[j, m * half + c] for c in range(half)) / math.sqrt(half)
                         for j in keys]
                    e = [math.exp(float(t) - max(float(u) for u in s)) for t in s]
                    maps.append([t / sum(e) for t in e])
                y = sum((maps[0][t] - lam * maps[1][t]) * v[j] for t, j in enumerate(keys))
                rms = math.sqrt(float((y**2).mean()) + 1e-5)
                out[b, i, h * d : (h + 1) * d] = y / rms * norm_w * (1 - (0.8 - 0.6 * math.exp(-0.3 * attn.block)))
    return out @ attn.proj.weight.double().T + attn.proj.bias.double()


def random_diff(dim: int = 16, heads: int = 2, block: int = 2, seed: int = 0) -> SinkAttention:
    """A float64 differential attention placed at `block` of 4, its lambdas and norm weight drawn away from init."""
    torch.manual_seed(seed)
    attn = SinkAttention(dim, heads, attn="diff", qkv_bias=True, block=block, depth=4).double()
    with torch.no_grad():
        for name in attn.kind_parameter_names:
            getattr(attn, name).normal_(0.0, 0.5)
    return attn


def test_scores_are_the_two_halves_of_each_head_at_their_own_scale() -> None:
    attn = random_diff()
    q, k = torch.randn(2, 2, 5, 8, dtype=torch.float64), torch.randn(2, 2, 6, 8, dtype=torch.float64)
    s = diff.scores(attn, q, k)
    assert s.shape == (2, 2, 2, 5, 6)
    for b, h, m, i, j in [(0, 0, 0, 0, 0), (1, 1, 1, 4, 5), (0, 1, 1, 2, 3), (1, 0, 0, 3, 1)]:
        by_hand = sum(q[b, h, i, 4 * m + c] * k[b, h, j, 4 * m + c] for c in range(4)) / 2.0  # (8 / 2)^-0.5
        assert abs(float(s[b, h, m, i, j] - by_hand)) < 1e-12


def test_the_module_equals_its_naive_formula_on_every_path() -> None:
    attn = random_diff()
    x = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert abs(diff.lam(attn, torch.float64).item() - lambda_by_hand(attn)) < 1e-12
    attn.fused_attn = True
    for mode, causal in (("sdpa", False), ("off", False), ("off", True)):
        attn.fused_mode = mode
        assert attn.kernel(is_causal=causal) == ("sdpa" if mode == "sdpa" and not causal else "explicit")
        torch.testing.assert_close(attn(x, is_causal=causal), naive_forward(attn, x, causal), rtol=1e-10,
                                   atol=1e-12)


def test_a_hand_row_and_lambda_init_per_block() -> None:
    attn = SinkAttention(8, 1, attn="diff")
    with torch.no_grad():
        for name in attn.kind_parameter_names[:4]:  # the lambdas: exp(0) - exp(0) = 0, lambda = lambda_init
            getattr(attn, name).zero_()
    # map 1 softmax(0, log 3) = (1/4, 3/4), map 2 (3/4, 1/4); block 0: lambda = 0.8 - 0.6 = 0.2
    s = torch.tensor([[[0.0, math.log(3)]], [[math.log(3), 0.0]]])  # (maps, N, K)
    torch.testing.assert_close(diff.matrix(attn, s, None), torch.tensor([[0.25 - 0.2 * 0.75, 0.75 - 0.2 * 0.25]]))
    hidden = torch.tensor([[False, True]])  # the second key hidden from both maps
    torch.testing.assert_close(diff.matrix(attn, s, hidden), torch.tensor([[1 - 0.2, 0.0]]))
    model = tiny_vit(attn="diff", depth=3)
    for b, blk in enumerate(model.blocks):
        with torch.no_grad():
            for name in blk.attn.kind_parameter_names[:4]:
                getattr(blk.attn, name).zero_()
        assert abs(diff.lam(blk.attn).item() - (0.8 - 0.6 * math.exp(-0.3 * b))) < 1e-6  # 0.2, 0.356, 0.471


def test_head_output_is_an_rms_norm_per_head_times_one_minus_lambda_init() -> None:
    attn = random_diff(block=1)
    y = torch.randn(2, 2, 3, 8, dtype=torch.float64)
    out = diff.head_output(attn, y)
    for b, h, i in [(0, 0, 0), (1, 1, 2), (0, 1, 1)]:
        row = y[b, h, i]
        by_hand = row / math.sqrt(float((row**2).mean()) + 1e-5) * attn.head_norm_weight * (0.2 + 0.6 * math.exp(-0.3))
        torch.testing.assert_close(out[b, h, i], by_hand)


def test_parameters_are_shared_by_the_heads_initialised_as_the_authors_and_counted() -> None:
    torch.manual_seed(0)
    wide = SinkAttention(4096, 2, attn="diff")  # head width 2048: four lambda vectors of 1024
    lambdas = torch.cat([getattr(wide, n).detach() for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")])
    assert lambdas.shape == (4096,) and abs(float(lambdas.std()) - 0.1) < 0.005 and abs(float(lambdas.mean())) < 0.01
    assert torch.equal(wide.head_norm_weight.detach(), torch.ones(2048))
    n = sum(p.numel() for p in build_vit("vit_mini", attn="diff").parameters())
    # vit_mini: 4 blocks of 4 heads of 32; per block four lambdas of 16 and one norm weight of 32
    assert n - sum(p.numel() for p in build_vit("vit_mini").parameters()) == 4 * (4 * 16 + 32)


def test_an_odd_head_width_is_refused_in_one_line() -> None:
    with pytest.raises(BadValue, match=r"head width 3 .* is odd"):
        SinkAttention(6, 2, attn="diff")


def test_the_sdpa_path_equals_the_explicit_one_forward_and_backward_in_float64() -> None:
    attn = random_diff(dim=32, heads=2, block=1)
    attn.fused_attn = True
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    results = {}
    for mode in ("sdpa", "off"):
        attn.fused_mode = mode
        y = attn(x)
        results[mode] = (y, *torch.autograd.grad(y.square().sum(), [x, *attn.parameters()]))
    assert attn.kind.fused and not attn.kind.flex
    for a, b in zip(results["sdpa"], results["off"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert all(g.abs().sum() > 0 for g in results["sdpa"][2:])  # every parameter learns, the lambdas too


def test_the_redirect_removes_the_sink_from_both_maps_and_equals_its_float64_twin() -> None:
    attn = SinkAttention(8, 1, attn="diff")
    with torch.no_grad():
        for name in attn.kind_parameter_names[:4]:
            getattr(attn, name).zero_()  # lambda = 0.2
    s = torch.tensor([[0.0, math.log(3), 5.0], [math.log(3), 0.0, 5.0]]).view(1, 2, 1, 3).expand(1, 2, 3, 3)
    is_sink = torch.zeros(1, 3, 3, dtype=torch.bool)
    is_sink[..., 2] = True
    none = torch.zeros(3, 3, dtype=torch.bool)
    red = diff.redirected(attn, s, 0, is_sink, none)
    torch.testing.assert_close(red, torch.tensor([0.25 - 0.2 * 0.75, 0.75 - 0.2 * 0.25, 0.0]).expand(1, 3, 3))
    # random scores, causal: each row against the twin on the keys it sees
    attn = random_diff()
    s = 4 * torch.randn(2, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    sink = torch.tensor([0, 3])
    is_sink = torch.zeros(2, 6, 6, dtype=torch.bool)
    is_sink[torch.arange(2), :, sink] = True
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    red = diff.redirected(attn, s, 1, is_sink, future)
    for b in range(2):
        for i in range(6):
            seen = i + 1
            at = int(sink[b]) if int(sink[b]) < seen else None
            twin = diff.reference_redirected(attn, s[b, :, i, :seen], 1, 6, at)
            torch.testing.assert_close(red[b, i, :seen], twin)
            assert not red[b, i, seen:].any()
    assert (red[0, 0] == 0).all()  # query 0 sees only the sink: nothing left


def test_the_check_predicts_no_row_of_the_redirect_from_a() -> None:
    attn = SinkAttention(16, 2, attn="diff", qkv_bias=True)
    x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(1))
    sink = torch.tensor([0, 2, 5])
    with torch.no_grad():
        a = attn.internals(x).attn[:, 1]
        _, rows = diff.expected_redirect(attn, a, sink)
        assert rows.shape == (3, 6) and not rows.any()
        assert check_redirect(a, attn.redirected(x, 1, sink), sink, attn) == (0.0, 0)


def planted_block() -> tuple[SinkBlock, torch.Tensor]:
    """One block, 4 tokens x_t = (e_t, 1, 0...) in 16 channels, 2 heads of 8 (halves of 4), lambda = 0.8. Head 0: both
    maps score key 0 log 27 above the others at every query, so each puts 27 / 30 = 0.9 on it: A_i0 = 0.9 - 0.8 * 0.9
    = 0.18, the others (0.1 - 0.08) / 3. Head 1: map 1 uniform (1/4), map 2 puts 0.9 on key 1: A_i1 = 0.25 - 0.72 =
    -0.47, the others 0.25 - 0.8 * 0.1 / 3."""
    torch.manual_seed(0)
    blk = SinkBlock(16, 2, attn="diff", qkv_bias=False, init_values=1.0)
    blk.norm1 = nn.Identity()
    x = torch.cat([torch.eye(4), torch.ones(4, 1), torch.zeros(4, 11)], dim=1)
    lead = 2 * math.log(27)  # times the halves' scale 1/2
    w = torch.zeros(48, 16)
    for row in (0, 4):  # head 0, maps 1 and 2: q = lead e_0 at every token, k = (is token 0) e_0
        w[row, 4], w[16 + row, 0] = lead, 1.0
    w[8 + 4, 4], w[16 + 8 + 4, 1] = lead, 1.0  # head 1, map 2 only: key 1
    w[32:48, 4] = torch.arange(1.0, 17.0)  # values: the same at every token
    with torch.no_grad():
        blk.attn.qkv.weight.copy_(w)
        blk.attn.lambda_q1.zero_(), blk.attn.lambda_k1.zero_(), blk.attn.lambda_q2.zero_(), blk.attn.lambda_k2.zero_()
        blk.attn.lambda_q1[0], blk.attn.lambda_k1[0] = math.log(1.6), 1.0  # exp(log 1.6) - exp(0) + 0.2 = 0.8
    return blk, x[None]


def test_the_diagnostics_read_a_planted_signed_head_by_its_magnitudes() -> None:
    blk, x = planted_block()
    assert abs(diff.lam(blk.attn).item() - 0.8) < 1e-6
    a = blk.attn.internals(x).attn[0].detach()
    torch.testing.assert_close(a[0, :, 0], torch.full((4,), 0.18))
    torch.testing.assert_close(a[1, :, 1], torch.full((4,), -0.47))
    d = diagnose_tokens([blk], x)
    other0, other1 = 0.02 / 3, 0.25 - 0.08 / 3
    assert d["sink_idx"][0, 0].tolist() == [0, 1]  # the cancelled sink by its net weight; the negative column by |A|
    np.testing.assert_allclose(d["mass"][0, 0], [0.18, 0.47], rtol=1e-5)
    np.testing.assert_allclose(d["neg_mass"][0, 0], [0.0, 0.47 / (0.47 + 3 * other1)], rtol=1e-5)
    # column sums of |A| over the 4 queries: max / median (the mean of the two middle ones)
    np.testing.assert_allclose(d["concentration"][0, 0], [0.18 / other0, 0.47 / other1], rtol=1e-5)
    assert d["routed_frac"][0, 0].tolist() == [0.0, 0.0]  # neither column reaches 0.5: no sink event


def test_the_exp_config_trains_diff_and_names_it() -> None:
    cfg = load_config(["exp=diff"])
    assert cfg.model.attn == "diff" and run_variant(cfg) == "diff"
    assert run_variant(load_config(["exp=diff", "model.registers=4"])) == "diff+reg"
    model = build_vit(str(cfg.model.size), attn="diff")  # the first run's model: 4 heads of 32
    assert model.blocks[0].attn.head_dim == 32


EVAL = ["eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1", "eval.linear_lrs=[0.01]",
        "eval.dense_epochs=1", "diagnostics.n_images=4", "diagnostics.plots=false", "diagnostics.report=false"]


def ok(proc) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_from_the_command_line_trained_diagnosed_probed_ranked_and_intervened(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    common = [*TINY, f"runs_dir={runs}", *EVAL]
    ok(run_module("vitsinks.launch", *common, "exp=diff", "name=d", "train.max_steps=2", "eval.after_train=true"))
    run = runs / "d"
    summary = json.loads((run / "diagnostics" / "final" / "summary.json").read_text())
    assert summary["head_shape"]["dead_by_block"] is not None
    assert (run / "results" / "linear.json").is_file() and (run / "results" / "knn.json").is_file()
    board = tmp_path / "board"
    ok(run_module("vitsinks.leaderboard", f"runs={runs}", f"out={board}"))
    assert "| diff | 1 |" in (board / "leaderboard.md").read_text()  # the variant's row, one seed

    # the trained checkpoint with head 0:0 made a [CLS] sink, then the redirect from the command line
    last = run / "checkpoints" / "last.pt"
    state = load(last)
    model, _ = backbone_from_state(state, last)
    torch.manual_seed(0)
    plant_cls_sink(model.eval())
    state["model"].update({f"backbone.{k}" if any(n.startswith("backbone.") for n in state["model"]) else k: v
                           for k, v in model.state_dict().items()})
    save_state(state, last)
    out = tmp_path / "interventions"
    ok(run_module("vitsinks.intervene", f"ckpt={last}", *common, "n_images=4", "heldout_images=0", "heads=[0:0]",
                  "edits=[redirect_sink_attention]", f"intervene.out={out}"))
    done = json.loads((out / "summary.json").read_text())
    assert done["checks"]["redirect_rows_checked"] == 0
    assert "the redirect from the scores checked on 0 rows" in (out / "by_class.md").read_text()
