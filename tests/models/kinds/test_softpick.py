"""Softpick attention (`vitsinks.models.kinds.softpick`) against its closed form and a naive float64 reference;
the kind-generic checks (naive reference through the module, redirect, parameter count, exp config) run for it from
the registry in tests/models/test_attention.py and test_vit.py."""

from __future__ import annotations

import math

import torch

from vitsinks.configs.schema import load_config
from vitsinks.models import ATTN_KINDS, KINDS, SinkAttention, run_variant

softpick = KINDS["softpick"]


def naive64(s: torch.Tensor, future: torch.Tensor | None = None) -> torch.Tensor:
    """relu(exp(s) - 1) / sum_j |exp(s_j) - 1| in float64, no shift, future keys out of both sums."""
    e = torch.exp(s.double()) - 1
    if future is not None:
        e = e.masked_fill(future, 0.0)
    return torch.relu(e) / e.abs().sum(-1, keepdim=True)


def test_a_hand_example_equals_the_closed_form() -> None:
    s = torch.tensor([[0.0, math.log(2), math.log(3), -math.log(2)]])  # exp(s) - 1 = 0, 1, 2, -1/2
    a = softpick.matrix(None, s, None)
    torch.testing.assert_close(a, torch.tensor([[0.0, 2 / 7, 4 / 7, 0.0]]))  # relu / (0 + 1 + 2 + 1/2)
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)
    causal = softpick.matrix(None, s.expand(4, 4), future)
    # query 1 sees keys 0, 1: (0, 1) / 1; query 2 sees 0..2: (0, 1, 2) / 3; future keys weigh nothing
    torch.testing.assert_close(causal[1], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    torch.testing.assert_close(causal[2], torch.tensor([0.0, 1 / 3, 2 / 3, 0.0]))
    assert causal[0].abs().sum() == 0  # query 0 sees only a zero score: it attends to nothing


def test_float32_agrees_with_a_naive_float64_reference_and_rows_sum_to_at_most_one() -> None:
    g = torch.Generator().manual_seed(0)
    s = torch.randn(4, 3, 9, 9, generator=g) * 8  # scores up to ~+-25: exp spans 20 decades
    future = torch.ones(9, 9, dtype=torch.bool).triu(1)
    for mask in (None, future):
        a = softpick.matrix(None, s, mask)
        torch.testing.assert_close(a.double(), naive64(s, mask), atol=1e-6, rtol=1e-5)
        rows = a.sum(-1)
        assert (rows <= 1 + 1e-6).all() and (a >= 0).all()
    assert (rows < 0.99).any()  # not normalised: rows with negative scores keep less than 1
    assert not softpick.normalised and not softpick.fused and "softpick" in ATTN_KINDS


def test_a_head_can_attend_to_nothing_and_gradients_stay_finite_at_large_scores() -> None:
    s = torch.tensor([[[-3.0, -1.0, -0.5], [900.0, 0.5, -900.0], [-900.0, -2000.0, -1e4]]], requires_grad=True)
    a = softpick.matrix(None, s, None)
    assert torch.equal(a[0, 0], torch.zeros(3)) and torch.equal(a[0, 2], torch.zeros(3))  # no positive score
    assert abs(float(a[0, 1, 0].detach()) - 1) < 1e-6  # float32 exp(900) would overflow without the shift
    (a * torch.randn(3, 3)).sum().backward()
    assert torch.isfinite(s.grad).all()
    attn = SinkAttention(8, 2, attn="softpick", qkv_bias=True)
    with torch.no_grad():
        attn.qkv.weight.mul_(200.0)  # scores in the hundreds
    x = torch.randn(2, 6, 8)
    out = attn(x, is_causal=True)
    out.square().mean().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(p.grad).all() for p in attn.parameters())


def test_the_exp_config_trains_softpick_and_names_it() -> None:
    cfg = load_config(["exp=softpick"])
    assert cfg.model.attn == "softpick" and run_variant(cfg) == "softpick"
    assert run_variant(load_config(["exp=softpick", "model.registers=4"])) == "softpick+reg"
