"""Small randomly initialised transformers vision models (DINOv2, DINOv2 with registers, ViT, CLIP, SigLIP) with
sharpened attention and non-trivial prefix tokens, and images of their size. Importing this module skips the tests
that do when transformers is missing (except under CI: `require`)."""

from __future__ import annotations

import torch
from torch import nn

from tests.helpers.requirements import require

T = require("transformers")

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 32, "patch_size": 8}
REGISTERS = 4


def build(name: str) -> nn.Module:
    """A small randomly initialised model with sharpened attention and non-trivial [CLS], registers and LayerScale."""
    torch.manual_seed(0)
    if name == "dinov2":
        m = T.Dinov2Model(T.Dinov2Config(**SMALL, mlp_ratio=2))
    elif name == "dinov2_reg":
        m = T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(**SMALL, mlp_ratio=2,
                                                                    num_register_tokens=REGISTERS))
    elif name == "vit":
        m = T.ViTModel(T.ViTConfig(**SMALL, intermediate_size=64))
    elif name == "clip":
        m = T.CLIPVisionModel(T.CLIPVisionConfig(**SMALL, intermediate_size=64))
    else:
        m = T.SiglipVisionModel(T.SiglipVisionConfig(**SMALL, intermediate_size=64))
    with torch.no_grad():
        for name_, p in m.named_parameters():
            if "q_proj.weight" in name_:
                p.mul_(4.0)
            elif "lambda1" in name_:
                p.uniform_(0.05, 1.0)
            elif name_.endswith(("cls_token", "register_tokens", "class_embedding")):
                p.normal_(0, 1.0)
    return m.eval()


def images(n: int = 3) -> torch.Tensor:
    """`n` seeded standard-normal images at the models' size."""
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))
