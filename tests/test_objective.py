"""The LeJEPA objective against lightly's own LeJEPALoss, and the model it trains."""

import torch
from lightly.loss import LeJEPALoss

from vitsinks.config import ObjectiveConfig
from vitsinks.models import build_vit
from vitsinks.objective import LeJEPAModel, LeJEPAObjective


def test_loss_equals_lightly_lejepa_loss() -> None:
    torch.manual_seed(0)
    g, loc = torch.randn(2, 32, 16), torch.randn(4, 32, 16)
    ours = LeJEPAObjective(ObjectiveConfig(lamb=0.05, slices=256, knots=17))
    ref = LeJEPALoss(lambda_param=0.05, sigreg_knots=17, sigreg_num_vectors=256)
    torch.manual_seed(1)
    terms = ours(g, loc)
    torch.manual_seed(1)  # the same random slices
    expected = ref(local_proj=loc, global_proj=g)
    torch.testing.assert_close(terms.loss, expected)
    assert terms.sigreg > 0 and terms.invariance > 0


def test_invariance_term_by_hand_and_global_only_views() -> None:
    torch.manual_seed(0)
    g = torch.randn(4, 8, 5)
    terms = LeJEPAObjective(ObjectiveConfig(lamb=0.0, slices=16))(g)
    centre = g.mean(0, keepdim=True)
    assert torch.allclose(terms.loss, ((g - centre) ** 2).mean())


def test_model_shapes_and_detached_probe() -> None:
    backbone = build_vit("vit_cpu", img_size=32, depth=1, embed_dim=48, num_heads=3)
    model = LeJEPAModel(backbone, ObjectiveConfig(proj_hidden=32, proj_out=16), num_classes=5)
    views = [torch.randn(3, 3, 32, 32), torch.randn(3, 3, 32, 32), torch.randn(3, 3, 16, 16)]
    pg, pl, logits = model(views, n_global=2)
    assert pg.shape == (2, 3, 16) and pl.shape == (1, 3, 16) and logits.shape == (6, 5)
    logits.sum().backward()  # the probe's loss must not reach the backbone
    assert all(p.grad is None for p in model.backbone.parameters())
    assert model.probe[1].weight.grad is not None
