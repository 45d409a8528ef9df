"""The LeJEPA loss under bf16: the reference's trainer (src/trainer.py) computes it inside the bf16 autocast on the
bf16 projections, and its SIGReg (src/sigreg.py) draws the slices in the projections' dtype; vitsinks does the same
under `objective.loss_in_autocast` (set by `recipe=paper`) and computes it in fp32 by default."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny import tiny_cfg, tiny_vit
from vitsinks.configs.schema import ObjectiveConfig
from vitsinks.objectives.lejepa import LeJEPA, LeJEPALoss
from vitsinks.objectives.objective import Runtime
from vitsinks.utils.errors import ConfigError

LAMB, SLICES, KNOTS, T_MAX = 0.02, 256, 17, 3.0


def reference_sigreg(proj: torch.Tensor) -> torch.Tensor:
    """The reference's SIGReg statistic written out from its definition, every operation in the order and dtype it
    computes them (so that an enclosing autocast acts on it as on the reference): the views pooled into V x N
    samples, unit slices from `torch.randn(D, S, dtype=proj.dtype)` normalised per column, the empirical
    characteristic function at `knots` points of [0, t_max] against exp(-t^2 / 2), trapezoidal weights (doubled
    by symmetry) times the window, times the sample count, averaged over the slices."""
    t = torch.linspace(0, T_MAX, KNOTS, dtype=torch.float32)
    dt = T_MAX / (KNOTS - 1)
    w = torch.full((KNOTS,), 2 * dt, dtype=torch.float32)
    w[[0, -1]] = dt
    phi = torch.exp(-t.square() / 2.0)
    x = proj.reshape(-1, proj.size(-1))
    a = torch.randn(x.size(-1), SLICES, dtype=x.dtype)
    a = a.div_(a.norm(p=2, dim=0))
    xt = (x @ a).unsqueeze(-1) * t
    err = (xt.cos().mean(0) - phi).square() + xt.sin().mean(0).square()
    return ((err @ (w * phi)) * x.size(0)).mean()


def reference_lejepa(proj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, sigreg, invariance) as the reference's training step computes them from proj (V, N, D)."""
    inv = (proj.mean(0) - proj).square().mean()
    sig = reference_sigreg(proj)
    return LAMB * sig + (1 - LAMB) * inv, sig, inv


def _projections(seed: int) -> torch.Tensor:
    """bf16 projections of the recipe's shape per GPU (4 views x 64 images x 128), not isotropic."""
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(4, 64, 128, generator=g) * (0.5 + torch.rand(128, generator=g)) + 0.2 * torch.randn(128,
                                                                                                   generator=g)
    return proj.bfloat16()


def _loss(in_autocast: bool) -> LeJEPALoss:
    return LeJEPALoss(ObjectiveConfig(lamb=LAMB, slices=SLICES, knots=KNOTS, sigreg="pooled_per_rank",
                                      loss_in_autocast=in_autocast))


def test_under_the_flag_the_loss_is_the_references_bf16_loss_bitwise() -> None:
    for seed in range(4):
        proj = _projections(seed)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.manual_seed(seed)
            want = reference_lejepa(proj)
            torch.manual_seed(seed)  # the same slices
            got = _loss(True)(proj)
        assert want[1].dtype == got.sigreg.dtype == torch.bfloat16
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w), (seed, float(g), float(w))


def test_under_the_flag_the_gradients_are_the_references_bitwise() -> None:
    """The gradient of the projections, not only the loss: autograd sums the parts each term sends back in the
    order the terms were computed, and the reference computes the invariance term before SIGReg; in the other order
    ~17% of the bf16 gradient's entries differ in the last bit."""
    for seed in range(3):
        proj = _projections(seed)
        grads = []
        for loss in (lambda p: reference_lejepa(p)[0], lambda p: _loss(True)(p).loss):
            leaf = proj.clone().requires_grad_(True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                torch.manual_seed(seed)  # the same slices
                out = loss(leaf)
            out.backward()
            grads.append(leaf.grad)
        assert grads[0].dtype == torch.bfloat16 and grads[0].abs().sum() > 0
        assert torch.equal(grads[1], grads[0]), (seed, (grads[1] != grads[0]).float().mean().item())


def test_by_default_the_loss_is_fp32_and_off_the_references_by_the_bf16_rounding() -> None:
    rel = []
    for seed in range(8):
        proj = _projections(seed)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.manual_seed(seed)
            want = reference_sigreg(proj)
            torch.manual_seed(seed)
            got = _loss(False)(proj).sigreg
        assert got.dtype == torch.float32
        torch.manual_seed(seed)  # the default is the reference's statistic computed in fp32 on the same projections
        torch.testing.assert_close(got, reference_sigreg(proj.float()), rtol=1e-5, atol=0)
        rel.append(abs(float(got) - float(want)) / float(want))
    print(f"fp32 default vs the reference's bf16 SIGReg: max {max(rel):.2%}, mean {sum(rel) / len(rel):.2%}")
    assert 0 < max(rel) < 0.01  # the reference's bf16 statistic (ulp 0.25 near 32) against the fp32 one


def test_the_training_step_computes_the_loss_inside_the_runs_autocast(runs) -> None:
    cfg = tiny_cfg(runs, "views.n_local=0", "views.n_global=4", "objective.sigreg=pooled_per_rank",
                   "objective.loss_in_autocast=true", f"objective.lamb={LAMB}", f"objective.slices={SLICES}")
    objective = LeJEPA(cfg, Runtime(torch.device("cpu"), bf16=True))
    torch.manual_seed(0)
    model = objective.build_model(tiny_vit(), num_classes=4)
    views, labels = [torch.randn(8, 3, 32, 32) for _ in range(4)], torch.randint(0, 4, (8,))
    torch.manual_seed(1)
    _, terms = objective.loss_terms(model, views, labels)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the reference: forward and loss in one autocast
        proj, _, _ = model(views, 4)
        torch.manual_seed(1)
        want = reference_lejepa(proj)
    assert proj.dtype == torch.bfloat16
    assert torch.equal(terms["sigreg"], want[1]) and torch.equal(terms["loss"], want[0])


def test_the_flag_needs_the_references_pooled_sigreg() -> None:
    with pytest.raises(ConfigError, match="pooled_per_rank"):
        LeJEPALoss(ObjectiveConfig(sigreg="per_view_global", loss_in_autocast=True))
