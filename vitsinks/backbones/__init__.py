"""Every model family as the one model seam (`vitsinks.models.seam.Backbone`): the adapter registry, the base views of
a foreign library's blocks (`views`) and one module per family, imported here so that each registers its adapter.
`adapt(model)` builds a model's `Backbone`. See docs/pretrained.md."""

from vitsinks.backbones import native, open_clip_vit, timm_eva, timm_vit, transformers_vit  # noqa: F401 - register
from vitsinks.backbones.adapter import ADAPTERS, Adapter, adapt, adapter_for
from vitsinks.backbones.native import sinkvit_backbone
from vitsinks.backbones.views import AttentionView, BlockView, GridRope, LayerScaleView, WeightView, own_linears
from vitsinks.models.seam import AddedRegister, Attention, Backbone, Block, LinearSite

__all__ = ["ADAPTERS", "AddedRegister", "Adapter", "Attention", "AttentionView", "Backbone", "Block", "BlockView",
           "GridRope", "LayerScaleView", "LinearSite", "WeightView", "adapt", "adapter_for", "own_linears",
           "sinkvit_backbone"]
