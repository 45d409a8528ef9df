"""The LeJEPA objective against lightly's own LeJEPALoss, and the model it trains."""

import torch
from lightly.loss import LeJEPALoss as LightlyLeJEPALoss

from tests.helpers.tiny import tiny_vit
from vitsinks.configs.schema import ObjectiveConfig
from vitsinks.objectives.lejepa import LeJEPALoss, LeJEPAModel


def test_loss_equals_lightly_lejepa_loss() -> None:
    torch.manual_seed(0)
    g, loc = torch.randn(2, 32, 16), torch.randn(4, 32, 16)
    ours = LeJEPALoss(ObjectiveConfig(lamb=0.05, slices=256, knots=17))
    ref = LightlyLeJEPALoss(lambda_param=0.05, sigreg_knots=17, sigreg_num_vectors=256)
    torch.manual_seed(1)
    terms = ours(g, loc)
    torch.manual_seed(1)  # the same random slices
    expected = ref(local_proj=loc, global_proj=g)
    torch.testing.assert_close(terms.loss, expected)
    assert terms.sigreg > 0 and terms.invariance > 0


def test_invariance_term_by_hand_and_global_only_views() -> None:
    torch.manual_seed(0)
    g = torch.randn(4, 8, 5)
    terms = LeJEPALoss(ObjectiveConfig(lamb=0.0, slices=16))(g)
    centre = g.mean(0, keepdim=True)
    assert torch.allclose(terms.loss, ((g - centre) ** 2).mean())


def test_model_shapes_and_detached_probe() -> None:
    backbone = tiny_vit(depth=1)
    model = LeJEPAModel(backbone, ObjectiveConfig(proj_hidden=32, proj_out=16), num_classes=5)
    views = [torch.randn(3, 3, 32, 32), torch.randn(3, 3, 32, 32), torch.randn(3, 3, 16, 16)]
    pg, pl, logits = model(views, n_global=2)
    assert pg.shape == (2, 3, 16) and pl.shape == (1, 3, 16) and logits.shape == (6, 5)
    logits.sum().backward()  # the probe's loss must not reach the backbone
    assert all(p.grad is None for p in model.backbone.parameters())
    assert model.probe[1].weight.grad is not None


def _epps_pulley_pooled(proj: torch.Tensor, slices: torch.Tensor, knots: int = 17, t_max: float = 3.0) -> float:
    """The reference's SIGReg written out in float64: every view's samples pooled into ONE statistic of V x N samples,
    `n * integral over t in [-t_max, t_max] of |ecf(t) - exp(-t^2 / 2)|^2 exp(-t^2 / 2) dt` (trapezoidal rule on
    `knots` points of [0, t_max], doubled by symmetry), averaged over the unit slices."""
    x = proj.reshape(-1, proj.shape[-1]).double() @ slices.double()  # (V*N, S)
    n = x.shape[0]
    t = torch.linspace(0, t_max, knots, dtype=torch.float64)
    dt = t_max / (knots - 1)
    w = torch.full((knots,), 2 * dt, dtype=torch.float64)
    w[0] = w[-1] = dt
    phi = torch.exp(-t**2 / 2)
    xt = x.unsqueeze(-1) * t  # (n, S, knots)
    err = (torch.cos(xt).mean(0) - phi) ** 2 + torch.sin(xt).mean(0) ** 2
    return float(((err * phi * w).sum(-1) * n).mean())


def test_pooled_sigreg_is_one_statistic_of_all_views_as_the_reference_computes_it() -> None:
    torch.manual_seed(0)
    proj = torch.randn(4, 16, 8) * torch.tensor([1.0, 1.5, 0.5, 1.0, 2.0, 1.0, 0.7, 1.0])  # not isotropic
    proj[1] += 0.8  # one view shifted: pooling the views is not the mean of per-view statistics
    pooled = LeJEPALoss(ObjectiveConfig(lamb=1.0, slices=64, sigreg="pooled_per_rank"))
    per_view = LeJEPALoss(ObjectiveConfig(lamb=1.0, slices=64, sigreg="per_view_global"))
    torch.manual_seed(5)
    got = float(pooled(proj).sigreg)
    torch.manual_seed(5)  # the same unit slices, drawn as torch.randn(D, S) then normalised per column
    a = torch.randn(8, 64)
    want = _epps_pulley_pooled(proj, a / a.norm(dim=0))
    assert abs(got - want) < 1e-4 * want
    torch.manual_seed(5)
    other = float(per_view(proj).sigreg)
    assert abs(other - want) > 0.05 * want  # the two forms differ (scale and what must be Gaussian)
