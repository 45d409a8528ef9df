"""Pretrained models as their libraries name and save them: timm's smallest ViT with a pretrained configuration, and
tiny transformers models written by `save_pretrained` alone."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.requirements import require

TIMM_NAME = "vit_tiny_patch16_224"  # 5.7M parameters: the smallest timm ViT with a pretrained configuration

SMALL_HF = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
            "patch_size": 8}


def model_alone(folder: Path, kind: str) -> tuple[torch.nn.Module, tuple[int, int]]:
    """A tiny random transformers model written by `save_pretrained` alone (no image processor) into `folder`, and
    the (height, width) its config names: DINOv2 (an int), ViT (a pair), CLIP (the vision config's, of a composite)."""
    transformers = require("transformers")
    torch.manual_seed(0)
    if kind == "dinov2":
        model, size = transformers.Dinov2Model(transformers.Dinov2Config(**SMALL_HF, image_size=32)), (32, 32)
    elif kind == "vit":
        model, size = transformers.ViTModel(transformers.ViTConfig(**SMALL_HF, image_size=[32, 48])), (32, 48)
    else:
        text = {**SMALL_HF, "vocab_size": 100}
        del text["patch_size"]
        cfg = transformers.CLIPConfig(text_config=text, vision_config={**SMALL_HF, "image_size": 40}, projection_dim=16)
        model, size = transformers.CLIPModel(cfg), (40, 40)
    model.eval().save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    return model, size
