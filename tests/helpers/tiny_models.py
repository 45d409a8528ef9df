"""One or more tiny randomly initialised models of every adapted model family (`vitsinks.backbones.ADAPTERS`), each
with its library's own final tokens (what the family's `Backbone.forward_features` must equal): the adapter contract
test's models. A model of an optional library (transformers, open_clip) skips the test that builds it when the library
is missing (except under CI: `requirements.require`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import timm
import torch
from torch import nn

from tests.helpers.requirements import require
from tests.helpers.timm_models import CONFIGS, timm_vit
from tests.helpers.tiny import tiny_vit

DIM, HEADS, PATCH = 48, 3, 8  # the DINOv3s'


def dinov3(name: str, registers: int = 4) -> nn.Module:
    """A small randomly initialised DINOv3 with sharpened attention, non-trivial [CLS], registers, biases and
    LayerScale (`hf*`: transformers' `DINOv3ViTModel`, `hf_gated` with a gated MLP; `timm*`: timm's `Eva`,
    `timm_qkvb` with q/v biases on the fused qkv)."""
    torch.manual_seed(0)
    if name.startswith("hf"):
        T = require("transformers")
        m = T.DINOv3ViTModel(T.DINOv3ViTConfig(hidden_size=DIM, num_hidden_layers=2, num_attention_heads=HEADS,
                                               intermediate_size=2 * DIM, image_size=32, patch_size=PATCH,
                                               num_register_tokens=registers, use_gated_mlp=name == "hf_gated"))
    else:
        arch = "vit_small_patch16_dinov3_qkvb" if name == "timm_qkvb" else "vit_small_patch16_dinov3"
        m = timm.create_model(arch, pretrained=False, img_size=32, patch_size=PATCH, embed_dim=DIM, num_heads=HEADS,
                              depth=2, num_classes=0, num_reg_tokens=registers)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(("q_proj.weight", "attn.qkv.weight")):
                p.mul_(4.0)
            elif n.endswith(("lambda1", "gamma_1", "gamma_2")):
                p.uniform_(0.05, 1.0)
            elif n.endswith(("cls_token", "register_tokens", "reg_token", "q_bias", "v_bias", "_proj.bias")):
                p.normal_(0, 1.0)
    return m.eval()


def _transformers(name: str) -> nn.Module:
    from tests.helpers.transformers_models import build  # skips without transformers

    return build(name)


def _open_clip() -> nn.Module:
    from tests.helpers.open_clip_models import tower  # skips without open_clip

    return tower()


def _hf_tokens(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' final tokens: `last_hidden_state`, after the final norm (CLIP's `post_layernorm`, which
    transformers applies to the pooled [CLS] only, here applied to every token as the backbone's readout does)."""
    out = m(pixel_values=x).last_hidden_state
    return m.post_layernorm(out) if type(m).__name__ == "CLIPVisionModel" else out


def _open_clip_pooled(v: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """open_clip's own output: the final-norm [CLS] through the tower's projection."""
    return v(x)


@dataclass(frozen=True)
class TinyModel:
    """A tiny model of one family: `build()`, its library's own final tokens (`reference(model, images)`; with
    `pooled`, the tower's pooled and projected output, compared with the backbone's [CLS] through `model.proj`)."""

    name: str
    family: str
    build: Callable[[], nn.Module]
    reference: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    pooled: bool = False


def _timm_tokens(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m.forward_features(x)


TINY_MODELS = (
    TinyModel("vitsinks_reg2", "vitsinks", lambda: tiny_vit(registers=2).eval(), _timm_tokens),
    TinyModel("timm_dinov2_reg", "timm", lambda: timm_vit(CONFIGS["dinov2_reg"]), _timm_tokens),
    TinyModel("timm_dinov3", "timm_eva", lambda: dinov3("timm"), _timm_tokens),
    TinyModel("hf_vit", "transformers", lambda: _transformers("vit"), _hf_tokens),
    TinyModel("hf_dinov2", "transformers", lambda: _transformers("dinov2"), _hf_tokens),
    TinyModel("hf_dinov2_reg", "transformers", lambda: _transformers("dinov2_reg"), _hf_tokens),
    TinyModel("hf_dinov3", "transformers", lambda: dinov3("hf"), _hf_tokens),
    TinyModel("hf_clip", "transformers", lambda: _transformers("clip"), _hf_tokens),
    TinyModel("hf_siglip", "transformers", lambda: _transformers("siglip"), _hf_tokens),
    TinyModel("open_clip", "open_clip", _open_clip, _open_clip_pooled, pooled=True),
)


def tiny_images(n: int = 4, seed: int = 1) -> torch.Tensor:
    """`n` seeded standard-normal images at the tiny models' size (32 px)."""
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
