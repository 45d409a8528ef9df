"""The vitsinks ViTs as timm models: `timm.create_model("vitsinks_<size>", attn=..., gate=..., registers=...)` builds
the same module as `build_vit(<size>, ...)`, one entry per `SIZES` name, registered when `vitsinks.models` is
imported. They have no pretrained weights of their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timm.models import register_model

from vitsinks.models.vit import SIZES, SinkViT, build_vit
from vitsinks.utils.errors import BadValue

__all__: list[str] = []  # timm's `register_model` appends every entry's name
PREFIX = "vitsinks_"
TIMM_ONLY = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")  # what timm.create_model adds


def _entrypoint(size: str) -> Callable[..., SinkViT]:
    def create(pretrained: bool = False, **kwargs: Any) -> SinkViT:
        if pretrained:
            raise BadValue(f"{PREFIX}{size} has no pretrained weights: build it and load a checkpoint or state dict")
        return build_vit(size, **{k: v for k, v in kwargs.items() if k not in TIMM_ONLY})

    create.__name__ = create.__qualname__ = f"{PREFIX}{size}"
    create.__module__ = __name__
    create.__doc__ = f"`build_vit({size!r}, **kwargs)` as a timm model."
    return create


for _size in SIZES:
    register_model(_entrypoint(_size))
