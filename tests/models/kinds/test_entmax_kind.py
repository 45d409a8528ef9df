"""1.5-entmax attention (`vitsinks.models.kinds.entmax15`) against hand-computed rows and a float64 bisection of its
threshold written here, its redirect (keys entmax newly selects) and what the built-in check can predict of it from
A, the diagnostics on a planted sparse head, and a run of `exp=entmax15` from the command line. The kind-generic
checks (naive reference through the module, redirect against its float64 twin, every mitigation) run for it from
the registry in tests/models/test_attention.py, test_vit.py and tests/test_contract.py."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.commands import run_module
from tests.helpers.tiny import TINY
from vitsinks.configs.schema import load_config
from vitsinks.diagnostics.fields import head_fields
from vitsinks.diagnostics.head_shape import attention_shape
from vitsinks.models import KINDS, SinkAttention, run_variant
from vitsinks.models.attention import select_kernel
from vitsinks.utils.errors import BadValue

entmax15 = KINDS["entmax15"]
CAUSAL = torch.ones(7, 7, dtype=torch.bool).triu(1)


def bisected(s: torch.Tensor) -> torch.Tensor:
    """1.5-entmax of one row of finite scores in float64 by bisection on the threshold: sum_j [s_j / 2 - tau]_+^2 falls
    from >= 1 at tau = max z - 1 to 0 at tau = max z (z = s / 2), and [z - tau]_+^2 at the tau where it is 1."""
    z = s.double() / 2
    lo, hi = float(z.max()) - 1, float(z.max())
    for _ in range(200):
        mid = (lo + hi) / 2
        if float(((z - mid).clamp_min(0) ** 2).sum()) >= 1:
            lo = mid
        else:
            hi = mid
    return (z - lo).clamp_min(0) ** 2


def bisected_matrix(s: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
    """`bisected` on every row of s (..., N, K) over its visible keys (a hand loop), hidden keys at 0."""
    flat = s.double().reshape(-1, *s.shape[-2:])
    out = torch.zeros_like(flat)
    for m in range(flat.shape[0]):
        for i in range(flat.shape[1]):
            seen = torch.ones(flat.shape[2], dtype=torch.bool) if hidden is None else ~hidden[i]
            out[m, i, seen] = bisected(flat[m, i, seen])
    return out.reshape(s.shape)


def test_hand_rows_equal_the_closed_form_with_exact_zeros() -> None:
    # z = s / 2 = (0, -0.2, -2.5, -2.5): on the support {0, 1} (0 - tau)^2 + (-0.2 - tau)^2 = 1 at tau = -0.8, so
    # the weights are 0.8^2, 0.6^2 and the keys with z <= -0.8 get exactly 0
    a = entmax15.matrix(None, torch.tensor([[0.0, -0.4, -5.0, -5.0]]), None)
    torch.testing.assert_close(a, torch.tensor([[0.64, 0.36, 0.0, 0.0]]))
    assert (a[0, 2:] == 0).all()
    # equal scores: uniform; a lead of 2 (1 in z): the whole row on one key (tau = max z - 1), the next key at 0
    torch.testing.assert_close(entmax15.matrix(None, torch.full((1, 5), 3.0), None), torch.full((1, 5), 0.2))
    assert torch.equal(entmax15.matrix(None, torch.tensor([[2.0, 0.0, -1.0]]), None), torch.tensor([[1.0, 0, 0]]))
    # hidden keys score -inf: exactly 0, the visible ones as if alone (query 1 sees keys 0, 1: z = (0, -0.2))
    causal = entmax15.matrix(None, torch.tensor([0.0, -0.4, 9.0, -5.0]).expand(4, 4), CAUSAL[:4, :4])
    torch.testing.assert_close(causal[0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(causal[1], torch.tensor([0.64, 0.36, 0.0, 0.0]))
    assert causal[2, 2] == 1 and (causal[:2, 2:] == 0).all()
    assert entmax15.sparse and entmax15.normalised and not (entmax15.signed or entmax15.fused or entmax15.flex)


@pytest.mark.parametrize("hidden", [None, CAUSAL], ids=["all", "causal"])
def test_float32_and_the_reference_agree_with_a_float64_bisection(hidden: torch.Tensor | None) -> None:
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 2, 7, 7, generator=g) * torch.tensor([0.3, 3.0, 12.0]).view(3, 1, 1, 1)  # dense to one-hot
    truth = bisected_matrix(s, hidden)
    a = entmax15.matrix(None, s, hidden)
    assert a.dtype == torch.float32
    torch.testing.assert_close(a.double(), truth, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(entmax15.matrix(None, s.double(), hidden), truth, atol=1e-12, rtol=1e-10)
    rows = a.sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))
    zeros = (truth == 0).float().mean()
    assert 0.1 < zeros < 0.9 and torch.equal(a == 0, truth == 0)  # sparse, the same exact zeros
    for row, visible in ((s[1, 0, 3], slice(None)), (s[2, 1, 6], slice(None)), (s[0, 1, 4], slice(0, 5))):
        ours = entmax15.reference(None, row[visible], 0, 7)
        torch.testing.assert_close(ours, bisected(row[visible]), atol=1e-12, rtol=1e-10)


def test_gradients_are_entmaxs_and_stay_finite_under_a_causal_mask() -> None:
    """The package's backward against autograd through the float64 reference (row by row) and finite differences."""
    g = torch.Generator().manual_seed(1)
    s = (torch.randn(2, 7, 7, generator=g, dtype=torch.float64) * 2).requires_grad_()
    w = torch.randn(2, 7, 7, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((entmax15.matrix(None, s, CAUSAL) * w).sum(), s)
    truth = torch.zeros_like(s)
    for b in range(2):
        for i in range(7):
            row = s[b, i, : i + 1]
            loss = (entmax15.reference(None, row, 0, 7) * w[b, i, : i + 1]).sum()
            (truth[b, i, : i + 1],) = torch.autograd.grad(loss, row)
    torch.testing.assert_close(grad, truth, atol=1e-12, rtol=1e-10)
    assert (grad[:, CAUSAL] == 0).all() and (grad != 0).any()
    assert torch.autograd.gradcheck(lambda x: entmax15.matrix(None, x, CAUSAL), (s,))
    attn = SinkAttention(8, 2, attn="entmax15", qkv_bias=True)
    with torch.no_grad():
        attn.qkv.weight.mul_(200.0)  # scores in the hundreds: one-hot rows
    out = attn(torch.randn(2, 6, 8), is_causal=True)
    out.square().mean().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(p.grad).all() for p in attn.parameters())


def test_rows_without_keys_are_zero_non_finite_scores_nan_and_low_precision_is_computed_in_float32() -> None:
    s = torch.tensor([[1.0, 0.5, 0.0], [1.0, float("nan"), 0.0], [float("inf"), 0.0, 0.0], [1.0, 2.0, 0.5]])
    hidden = torch.tensor([[False] * 3, [False] * 3, [False] * 3, [True] * 3])
    a = entmax15.matrix(None, s, hidden)
    assert float(a[0].sum()) == pytest.approx(1.0) and a[1:3].isnan().all() and torch.equal(a[3], torch.zeros(3))
    s16 = torch.randn(4, 9, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert entmax15.matrix(None, s16, None).dtype == torch.bfloat16  # as softmax: the scores' dtype, ...
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a16 = entmax15.matrix(None, s16, None)
    assert a16.dtype == torch.float32  # ... float32 under autocast, computed there from the bfloat16 scores
    torch.testing.assert_close(a16, entmax15.matrix(None, s16.float(), None))


def test_the_redirect_gives_the_sinks_share_to_the_keys_entmax_then_selects() -> None:
    # z = s / 2 = (2, 0, -0.2, -2.5): the sink takes the whole row (the others are <= tau = 1); without it
    # entmax of (0, -0.2, -2.5) gives (0.64, 0.36, 0): keys that had exactly 0 get the sink's share (no rescaling
    # of A can), the last stays below the new threshold
    s = torch.tensor([[[4.0, 0.0, -0.4, -5.0]]])
    is_sink = torch.tensor([[[True, False, False, False]]])
    assert torch.equal(entmax15.matrix(None, s, None), torch.tensor([[[1.0, 0, 0, 0]]]))
    red = entmax15.redirected(None, s, 0, is_sink, torch.zeros(1, 4, dtype=torch.bool))
    torch.testing.assert_close(red, torch.tensor([[[0.0, 0.64, 0.36, 0.0]]]))
    twin = entmax15.reference_redirected(None, s[0, 0].double(), 0, 1, 0)
    torch.testing.assert_close(twin, torch.tensor([0.0, 0.64, 0.36, 0.0], dtype=torch.float64))
    # a query that sees only the sink has no key left
    only = entmax15.redirected(None, s, 0, is_sink, torch.tensor([[False, True, True, True]]))
    assert torch.equal(only, torch.zeros(1, 1, 4))


def test_the_check_predicts_the_redirect_from_a_only_where_no_key_at_zero_could_enter() -> None:
    """Row 0: every key weighted, (0.26, 0.49, 0.25) = u^2 with u_j = z_j - tau = (., 0.7, 0.5); without the sink the
    threshold drops by 0.1 ((0.8)^2 + (0.6)^2 = 1), giving (0, 0.64, 0.36), from A alone and from the scores (tau = 0:
    s = 2 u). Row 1: the sink at 0, the row unchanged. Row 2: a key at 0 whose score A does not hold: no prediction."""
    u = torch.tensor([math.sqrt(0.26), 0.7, 0.5], dtype=torch.float64)
    f64 = {"dtype": torch.float64}
    s = torch.stack([2 * u, torch.tensor([-9.0, 0.0, 0.0], **f64), torch.tensor([0.0, -0.4, -5.0], **f64)])
    a = entmax15.matrix(None, s.unsqueeze(0), None)
    torch.testing.assert_close(a[0], torch.tensor([[0.26, 0.49, 0.25], [0, 0.5, 0.5], [0.64, 0.36, 0]],
                                                  dtype=torch.float64))
    sink = torch.tensor([0])
    expected, rows = entmax15.expected_redirect(None, a, sink)
    assert rows.tolist() == [[True, True, False]]
    torch.testing.assert_close(expected[0, 0], torch.tensor([0.0, 0.64, 0.36], dtype=torch.float64))
    assert torch.equal(expected[0, 1], a[0, 1])
    red = entmax15.redirected(None, s.unsqueeze(0), 0, torch.tensor([True, False, False]).expand(1, 3, 3),
                              torch.zeros(3, 3, dtype=torch.bool))
    torch.testing.assert_close(red[0, :2], expected[0, :2])
    torch.testing.assert_close(red[0, 2], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))  # z = (-0.2, -2.5)


def test_the_diagnostics_read_a_planted_sparse_head_as_computed_by_hand() -> None:
    """Head 0: keys 2 and 3 get exactly 0 at every query (half the keys); rows (0.64, 0.36), (0.36, 0.64), (0.64, 0.36),
    (0.64, 0.36) on keys 0, 1. Column sums (2.28, 1.72, 0, 0): the median is (0 + 1.72) / 2, so concentration
    2.28 / 0.86; diag_mass (0.64 + 0.64 + 0 + 0) / 4; key 0 the sink, mass 2.28 / 4, routed at queries 0, 2, 3 (>=
    0.5), min_a 0.36. Head 1: only key 0 is ever attended (three of four columns 0): concentration inf. Neither head
    is dead (rows sum to 1, a 1.5-entmax head never attends to nothing)."""
    head0 = torch.tensor([[0.0, -0.4, -5.0, -5.0], [-0.4, 0.0, -5.0, -5.0], [0.0, -0.4, -5.0, -5.0],
                          [0.0, -0.4, -5.0, -5.0]])
    head1 = torch.tensor([[3.0, 0.0, 0.0, 0.0]]).expand(4, 4)
    a = entmax15.matrix(None, torch.stack([head0, head1]).unsqueeze(0), None)  # (1, 2, 4, 4)
    assert (a[0, 0, :, 2:] == 0).all() and (a[0, 1, :, 1:] == 0).all()
    shape = attention_shape(a)
    assert shape["concentration"][0, 0] == pytest.approx(2.28 / 0.86, rel=1e-6)
    assert shape["concentration"][0, 1] == math.inf
    assert shape["diag_mass"][0].tolist() == pytest.approx([0.32, 0.25], rel=1e-6)
    assert shape["dead"][0].tolist() == [0.0, 0.0] and shape["neg_mass"][0].tolist() == [0.0, 0.0]
    v = torch.zeros(1, 2, 4, 4)
    v[..., 0, 0] = 2.0  # key 0's value norm 2, the others' 1
    v[..., 1:, 1] = 1.0
    f = head_fields(a, v, torch.eye(8), None)
    assert f["sink_idx"][0].tolist() == [0, 0]
    assert f["mass"][0].tolist() == pytest.approx([2.28 / 4, 1.0], rel=1e-6)
    assert f["routed_frac"][0].tolist() == [0.75, 1.0]
    assert f["min_a"][0].tolist() == pytest.approx([0.36, 1.0], rel=1e-6)
    assert f["ratio_head"][0].tolist() == pytest.approx([2.0, 2.0])


def test_the_exp_config_names_the_kind_and_the_kernel_is_the_explicit_one() -> None:
    cfg = load_config(["exp=entmax15"])
    assert cfg.model.attn == "entmax15" and run_variant(cfg) == "entmax15"
    assert run_variant(load_config(["exp=entmax15", "model.registers=4"])) == "entmax15+reg"
    for mode in ("auto", "flex", "sdpa"):
        assert select_kernel(entmax15, mode, "cuda", causal=False, dropout=False, sdpa=True, head_dim=64) == "explicit"


def test_without_the_entmax_package_the_kind_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "entmax", None)  # `import entmax` raises ImportError
    with pytest.raises(BadValue, match="needs the entmax package: pip install entmax"):
        entmax15.matrix(None, torch.zeros(1, 3), None)


@pytest.mark.slow
def test_exp_entmax15_trains_diagnoses_probes_and_reaches_the_leaderboard(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fast = ["diagnostics.enabled=true", "diagnostics.n_images=4", "diagnostics.plots=false", "diagnostics.report=false",
            "eval.after_train=true", "eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1",
            "eval.linear_lrs=[0.01]", "eval.dense_epochs=1"]
    out = run_module("vitsinks.launch", "exp=entmax15", *TINY, *fast, f"runs_dir={runs}", "name=em",
                     "train.max_steps=3")
    assert out.returncode == 0, out.stderr[-3000:]
    run = runs / "em"
    losses = [m["loss"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in m]
    assert losses and all(math.isfinite(x) for x in losses)
    summary = json.loads((run / "diagnostics" / "final" / "summary.json").read_text())
    assert summary["head_shape"]["dead_by_block"] == [0.0, 0.0]  # rows sum to 1: no head attends to nothing
    assert (run / "results" / "linear.json").is_file()
    board = run_module("vitsinks.leaderboard", f"runs={runs}")
    assert board.returncode == 0, board.stderr[-3000:]
    assert "entmax15" in (runs / "leaderboard" / "leaderboard.md").read_text()
