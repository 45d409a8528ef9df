"""Hugging Face transformers vision towers (the module layout of transformers >= 5): `Dinov2Model`,
`Dinov2WithRegistersModel`, `DINOv3ViTModel`, `ViTModel`, `CLIPVisionModel`, `SiglipVisionModel`, and the models that
hold one (`vision_model`, `dinov2`, `vit`: `CLIPModel`, `Dinov2ForImageClassification`, ...; their classifier unread).
Each architecture's names are in `SPECS`; transformers is never imported here (a model is recognised by its class's
module and name). Layout: a [CLS] (none for SigLIP), `num_register_tokens` registers, the patches; the readout is the
final norm over every token. DINOv3's RoPE comes from the model's own `rope_embeddings`, kept for the blocks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from vitsinks.backbones.adapter import ADAPTERS, Adapter
from vitsinks.backbones.views import AttentionView, BlockView, GridRope, LayerScaleView
from vitsinks.models.mlp import MLPParts, plain_mlp
from vitsinks.models.seam import Backbone, Block
from vitsinks.utils.errors import BadValue

WRAPPED = ("vision_model", "dinov2", "vit")  # where a model that holds a vision tower keeps it


@dataclass(frozen=True)
class Spec:
    """Where one architecture keeps its parts: dotted paths from the tower (`layers`, `embed`, `readout`, `rope`:
    pixels -> (cos, sin)) or from a layer (`attn`, `norm1`, `norm2`, LayerScale `ls1` / `ls2` with `lambda1`, `mlp`)."""

    layers: str
    embed: tuple[str, ...]  # applied in order to the pixels
    readout: str
    attn: str
    norm1: str
    norm2: str
    ls1: str | None = None
    ls2: str | None = None
    mlp: str = "mlp"
    num_cls: int = 1
    rope: str | None = None


DINOV2 = Spec("encoder.layer", ("embeddings",), "layernorm", "attention", "norm1", "norm2", "layer_scale1",
              "layer_scale2")
CLIP_LIKE: dict[str, Any] = {"layers": "encoder.layers", "readout": "post_layernorm", "attn": "self_attn",
                             "norm1": "layer_norm1", "norm2": "layer_norm2"}
SPECS: dict[str, Spec] = {
    "Dinov2Model": DINOV2,
    "Dinov2WithRegistersModel": DINOV2,
    "DINOv3ViTModel": Spec("model.layer", ("embeddings",), "norm", "attention", "norm1", "norm2", "layer_scale1",
                           "layer_scale2", rope="rope_embeddings"),
    "ViTModel": Spec("layers", ("embeddings",), "layernorm", "attention", "layernorm_before", "layernorm_after"),
    "CLIPVisionModel": Spec(embed=("embeddings", "pre_layrnorm"), **CLIP_LIKE),
    "SiglipVisionModel": Spec(embed=("embeddings",), num_cls=0, **CLIP_LIKE),
}


def _get(module: nn.Module, path: str) -> Any:
    """The submodule (or parameter) at dotted `path`, typed loosely: transformers is never imported here."""
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _first(module: nn.Module, *names: str) -> Any:
    """The first of `names` that `module` has (a `BadValue` naming them when none)."""
    for name in names:
        if hasattr(module, name):
            return getattr(module, name)
    raise BadValue(f"a {type(module).__name__} has none of {names}: a transformers layout this adapter does not know "
                   f"(it reads transformers >= 5)")


def tower(model: nn.Module) -> nn.Module:
    """The vision tower of `model`: itself, or the one it holds (`WRAPPED`)."""
    for _ in range(3):
        if type(model).__name__ in SPECS:
            return model
        inner = next((getattr(model, n) for n in WRAPPED if isinstance(getattr(model, n, None), nn.Module)), None)
        if inner is None:
            break
        model = inner
    return model


class HFAttention(AttentionView):
    """Separate q, k, v projections (no q/k norm), RoPE where the model has it, then the output projection."""

    def __init__(self, attn: nn.Module, rope: GridRope | None = None) -> None:
        heads = int(_first(attn, "num_attention_heads", "num_heads"))
        super().__init__(heads, int(_get(attn, "head_dim")), cast(nn.Linear, _first(attn, "o_proj", "out_proj")),
                         float(_first(attn, "scaling", "scale")))
        self.module: Any = attn  # transformers' attention module, its projections read by name
        self.rope = rope
        if rope is not None:
            # the function the attention's own forward calls
            rotate = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
            if rotate is None:
                raise BadValue(f"{type(attn).__module__} has no apply_rotary_pos_emb: a transformers RoPE layout this "
                               f"adapter does not know")
            self.rotate: Callable[..., tuple[torch.Tensor, torch.Tensor]] = rotate

    def qkv_weight(self) -> torch.Tensor:
        m = self.module
        return torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight])

    def _qkv(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.module
        q, k, v = (self.split_heads(p(z)) for p in (m.q_proj, m.k_proj, m.v_proj))
        if self.rope is not None:
            q, k = self.rotate(q, k, *self.rope.get(z.shape[1])[0])
        return q, k, v


class HFBlock(BlockView):
    """x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x))) (dropout and stochastic depth: off in evaluation)."""

    mlp: nn.Module  # every layer of `SPECS` has its MLP

    def __init__(self, layer: nn.Module, spec: Spec, rope: GridRope | None = None) -> None:
        ls1 = LayerScaleView(_get(layer, spec.ls1).lambda1) if spec.ls1 else None
        super().__init__(layer, HFAttention(_get(layer, spec.attn), rope), _get(layer, spec.norm1), ls1,
                         _get(layer, spec.mlp), _get(layer, spec.ls2) if spec.ls2 else None)
        self.rope = rope
        self.norm2 = _get(layer, spec.norm2)
        self.ls2 = LayerScaleView(_get(layer, spec.ls2).lambda1) if spec.ls2 else nn.Identity()

    def mlp_parts(self) -> MLPParts | None:
        """fc1 -> activation_fn -> fc2 (ViT, DINOv2, CLIP, SigLIP) or up_proj -> act_fn -> down_proj (DINOv3); None
        for a gated MLP (`gate_proj`: its activation is only the gate) or DINOv2's SwiGLU."""
        gamma = getattr(self.ls2, "gamma", None)
        if hasattr(self.mlp, "gate_proj"):
            return None
        return (plain_mlp(self.mlp, ("fc1", "activation_fn", "fc2"), gamma)
                or plain_mlp(self.mlp, ("up_proj", "act_fn", "down_proj"), gamma))

    def real_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rope is None:
            out = self.block(x, None)
        else:
            out = self.block(x, None, position_embeddings=self.rope.get(x.shape[1])[0])
        return out[0] if isinstance(out, tuple) else out  # transformers < 5 returned a tuple


def _embed(model: nn.Module, spec: Spec, rope: GridRope | None) -> Callable[[torch.Tensor], torch.Tensor]:
    steps = [_get(model, p) for p in spec.embed]
    rope_module = _get(model, spec.rope) if spec.rope else None
    dtype = next(model.parameters()).dtype

    def embed(images: torch.Tensor) -> torch.Tensor:
        """Tokens entering the first layer, as the model's forward computes them (and its RoPE, kept in `rope`)."""
        x = images.to(dtype)
        if rope is not None:
            assert rope_module is not None  # both come from `spec.rope`
            cos, sin = rope_module(x)
            rope.set((cos, sin), cos.shape[-2])
        for step in steps:
            x = step(x)
        return x

    return embed


def _patch_size(config: Any) -> tuple[int, int]:  # a transformers config
    p = config.patch_size
    return (int(p), int(p)) if isinstance(p, int) else (int(p[0]), int(p[1]))


@ADAPTERS.register
class TransformersViT(Adapter):
    family = "transformers"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        inner = tower(model)
        return type(inner).__module__.startswith("transformers.") and type(inner).__name__ in SPECS

    @classmethod
    def adapt(cls, model: nn.Module) -> Backbone:
        inner = tower(model)
        spec = SPECS[type(inner).__name__]
        config = inner.config
        registers = int(getattr(config, "num_register_tokens", 0) or 0)
        rope = GridRope(spec.num_cls + registers + 1) if spec.rope else None  # + 1: a test-time register
        blocks: list[Block] = [HFBlock(layer, spec, rope) for layer in _get(inner, spec.layers)]
        name = getattr(config, "name_or_path", "") or type(inner).__name__
        return Backbone(model, cls.family, blocks, _embed(inner, spec, rope), _get(inner, spec.readout),
                       _patch_size(config), registers, spec.num_cls, None, name)
