"""vitsinks' ViTs in timm's own layouts (docs/export.md): which variants timm builds from a config alone, the timm
model that computes the same function, and the key mapping both ways.

- `VisionTransformer` (layout `vit`): the base ViT, registers, LayerScale; the state dicts share every key but the
  registers' position rows (zeros in timm's). The features are equal bit for bit.
- `NaFlexVit` (layout `naflexvit`) for the elementwise G1 gate (`attn_gated`): `embeds.*`, `gamma_1` / `gamma_2`,
  `q_bias` / `v_bias` (the key bias dropped: softmax ignores it) and [CLS]'s position added to the token. Equal up
  to rounding (`check_equal` measures it at every export).

What timm cannot build (`unmappable`) keeps vitsinks' own layout (`vitsinks.publish.loader` reads both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import timm
import torch
from timm.layers import LayerScale
from torch import nn

from vitsinks.models import MITIGATIONS, NoMLP, SinkBlock, SinkViT, load_timm_state_dict
from vitsinks.models.kinds import DEFAULT_KIND
from vitsinks.models.mitigations.gate import G1GateMitigation
from vitsinks.utils.errors import BadValue, CheckFailed

VIT, NAFLEX = "vit", "naflexvit"  # the timm layouts (config.json's `vitsinks.layout`; `vitsinks` is vitsinks' own)
TIMM_EPS = 1e-6  # the eps of timm's LayerNorm, the one its configs can build
VIT_FALLBACK = "vit_base_patch16_224"  # the builder of a size timm has no name for: model_args give every size
# NaFlexVit's plain builder; model_args set every switch of its registered config that differs from vitsinks' ViT
NAFLEX_BUILDER = "naflexvit_base_patch16_gap"
CHECK_IMAGES = 2  # seeded random images the export's equality check runs
CHECK_RTOL = 1e-4  # a max |difference| above this x the largest feature is a wrong mapping (float32 noise is ~1e-7)


@dataclass(frozen=True)
class TimmModel:
    """The timm model of a `SinkViT`: `timm.create_model(architecture, **model_args)` with `state_dict` loaded."""

    layout: str
    architecture: str
    model_args: dict[str, Any]
    state_dict: dict[str, torch.Tensor]

    def build(self) -> nn.Module:
        """The timm model with these weights, in evaluation mode."""
        model = timm.create_model(self.architecture, **self.model_args)
        own = model.state_dict()
        model.load_state_dict(fill_identity(self.state_dict, own), strict=True)
        return model.eval()


def gated(model: SinkViT) -> bool:
    """The model has the elementwise G1 gate (the one gate timm has)."""
    return model.mitigations.get(G1GateMitigation.name) == "elementwise"


def unmappable(model: SinkViT) -> list[str]:
    """Why timm cannot build `model` from a config: one reason per thing it lacks (empty: it can)."""
    reasons = []
    if model.attn_kind != DEFAULT_KIND:
        reasons.append(f"its attention kind is {model.attn_kind} (timm's attention is {DEFAULT_KIND})")
    for name, setting in model.mitigations.items():
        if setting is not None and not (name == G1GateMitigation.name and gated(model)):
            reasons.append(f"its {MITIGATIONS[name].tag(setting)} mitigation (model.{name}) has no timm counterpart")
    blk = cast(SinkBlock, model.blocks[0])
    if isinstance(blk.mlp, NoMLP):
        reasons.append("its blocks are attention-only (model.mlp=false)")
    if model.rope is not None:
        reasons.append("its patches' RoPE (model.rope) is not the RoPE of a timm config")
    eps = sorted({float(n.eps) for n in model.modules() if isinstance(n, nn.LayerNorm)} - {TIMM_EPS})
    if eps:
        reasons.append(f"its LayerNorm eps is {', '.join(f'{e:g}' for e in eps)} (timm's configs build {TIMM_EPS:g})")
    if gated(model) and blk.attn.qkv.bias is None:
        reasons.append("its gate has a bias but no qkv bias (timm's gated attention has a gate bias only with one)")
    if model.edits:
        reasons.append(f"it carries post-hoc edits ({', '.join(label for label, _ in model.edits)})")
    return reasons


def _architecture(model: SinkViT, layerscale_init: float | None) -> dict[str, Any]:
    """The arguments both timm models share: sizes, biases, LayerScale, [CLS] and registers, no head."""
    blk = cast(SinkBlock, model.blocks[0])
    dim = model.embed_dim
    hidden = cast(nn.Linear, blk.mlp.fc1).out_features  # a timm Mlp (`unmappable` refuses the others)
    if int(dim * (hidden / dim)) != hidden:
        raise BadValue(f"an MLP of {hidden} units on width {dim} has no mlp_ratio timm rebuilds it from")
    has_ls = isinstance(blk.ls1, LayerScale)
    return {"img_size": list(model.patch_embed.img_size), "patch_size": model.patch_embed.patch_size[0],
            "in_chans": model.patch_embed.proj.in_channels, "embed_dim": dim, "depth": len(model.blocks),
            "num_heads": blk.attn.num_heads, "mlp_ratio": hidden / dim, "qkv_bias": blk.attn.qkv.bias is not None,
            "init_values": (float(layerscale_init) if layerscale_init else 1.0) if has_ls else None,
            "class_token": True, "global_pool": "token", "num_classes": 0,
            **({"qk_norm": True} if model.qk_norm else {})}  # timm's q_norm / k_norm: the same LayerNorms


def vit_state(model: SinkViT) -> dict[str, torch.Tensor]:
    """`model`'s state dict in timm `VisionTransformer`'s layout (the registers' zero position rows)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    r = model.num_reg_tokens
    if r and model.pos_embed is not None and not model.register_pos_embed:
        pe = sd["pos_embed"]
        sd["pos_embed"] = torch.cat([pe[:, :1], pe.new_zeros(1, r, pe.shape[2]), pe[:, 1:]], dim=1)
    return sd


def vit_to_naflex(sd: dict[str, torch.Tensor], registers: int, grid: tuple[int, int]) -> dict[str, torch.Tensor]:
    """A timm-`VisionTransformer` state dict in NaFlexVit's keys (prefix positions added to the tokens)."""
    pe = sd.get("pos_embed")
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k == "pos_embed":
            out["embeds.pos_embed"] = v[:, 1 + registers:].reshape(1, *grid, v.shape[-1])
        elif k == "cls_token":
            out["embeds.cls_token"] = v if pe is None else v + pe[:, :1]
        elif k == "reg_token":
            out["embeds.reg_token"] = v if pe is None else v + pe[:, 1:1 + registers]
        elif k.startswith("patch_embed."):
            out["embeds." + k.removeprefix("patch_embed.")] = v
        elif k.endswith(".attn.qkv.bias"):
            q, _, value = v.chunk(3)  # the key bias: a constant per query's scores, which softmax drops
            out[k.replace(".qkv.bias", ".q_bias")], out[k.replace(".qkv.bias", ".v_bias")] = q, value
        elif k.endswith((".ls1.gamma", ".ls2.gamma")):
            out[k.replace(".ls1.gamma", ".gamma_1").replace(".ls2.gamma", ".gamma_2")] = v
        else:
            out[k] = v
    return out


def naflex_to_vit(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`vit_to_naflex` backwards (the qkv bias with a zero key part)."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k == "embeds.pos_embed":
            out["pos_embed"] = v.reshape(1, -1, v.shape[-1])
        elif k.startswith("embeds.proj."):
            out["patch_embed." + k.removeprefix("embeds.")] = v
        elif k.startswith("embeds."):
            out[k.removeprefix("embeds.")] = v
        elif k.endswith(".attn.q_bias"):
            out[k.replace(".q_bias", ".qkv.bias")] = torch.cat([v, torch.zeros_like(v), sd[k.replace("q_", "v_")]])
        elif k.endswith(".attn.v_bias"):
            continue
        else:
            out[k.replace(".gamma_1", ".ls1.gamma").replace(".gamma_2", ".ls2.gamma")] = v
    return out


# a missing bias adds 0, a missing LayerScale (NaFlexVit's keys and timm ViT's) scales by 1
IDENTITY = {".bias": 0.0, ".gamma_1": 1.0, ".gamma_2": 1.0, ".ls1.gamma": 1.0, ".ls2.gamma": 1.0}


def _identity(key: str) -> float | None:
    return next((x for end, x in IDENTITY.items() if key.endswith(end)), None)


def fill_identity(sd: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`sd` with the identity tensors (zero biases, unit LayerScales) `own` has and `sd` lacks."""
    out = dict(sd)
    for k, v in own.items():
        if k not in out and (fill := _identity(k)) is not None:
            out[k] = torch.full_like(v, fill)
    return out


def drop_identity(sd: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`fill_identity` backwards: the identity tensors of `sd` that `own` has no key for."""
    return {k: v for k, v in sd.items()
            if k in own or (fill := _identity(k)) is None or not bool((v == fill).all())}


def to_timm(model: SinkViT, size: str, layerscale_init: float | None) -> TimmModel:
    """The timm model of `model`; a `BadValue` with the reasons when timm cannot build it (`unmappable`)."""
    if reasons := unmappable(model):
        raise BadValue(f"timm cannot build this model from a config: {'; '.join(reasons)}")
    args = _architecture(model, layerscale_init)
    sd = vit_state(model)
    pos = "learn" if model.pos_embed is not None else "none"
    if not gated(model):
        args.update(proj_bias=cast(SinkBlock, model.blocks[0]).attn.proj.bias is not None, no_embed_class=False,
                    reg_tokens=model.num_reg_tokens, pos_embed=pos, dynamic_img_size=bool(model.dynamic_img_size))
        args = {k: v for k, v in args.items() if v is not None}  # timm.create_model drops them too
        name = f"{size}_patch{args['patch_size']}_{args['img_size'][0]}"  # timm's name of this size, if it has one
        return TimmModel(VIT, name if timm.is_model(name) else VIT_FALLBACK, args, sd)
    grid = tuple(model.patch_embed.grid_size)
    args.update(attn_gated=True, reg_tokens=model.num_reg_tokens, fc_norm=False, embed_proj_type="conv",
                pos_embed="learned" if pos == "learn" else "none", pos_embed_grid_size=list(grid),
                init_values=args["init_values"] or 1.0)  # the builder's LayerScale cannot be switched off: ones
    return TimmModel(NAFLEX, NAFLEX_BUILDER, args, vit_to_naflex(sd, model.num_reg_tokens, grid))


def from_timm(model: SinkViT, sd: dict[str, torch.Tensor], layout: str, what: str) -> None:
    """Load a state dict in timm layout `layout` into `model`; one that does not fit names `what`."""
    if layout not in (VIT, NAFLEX):
        raise BadValue(f"{what}: unknown layout {layout!r} (one of {VIT}, {NAFLEX})")
    if layout == NAFLEX:
        sd = naflex_to_vit(sd)
    load_timm_state_dict(model, drop_identity(sd, model.state_dict()), what=what)


@torch.no_grad()
def check_equal(model: SinkViT, timm_model: nn.Module) -> float:
    """The largest |difference| of the two models' features on seeded images; `CheckFailed` above `CHECK_RTOL`."""
    h, w = model.patch_embed.img_size
    x = torch.randn(CHECK_IMAGES, model.patch_embed.proj.in_channels, h, w,
                    generator=torch.Generator().manual_seed(0))
    features = cast(Callable[[torch.Tensor], torch.Tensor], timm_model.float().eval().forward_features)  # timm's
    ours, theirs = model.float().eval().forward_features(x), features(x)
    if ours.shape != theirs.shape or not bool(torch.isfinite(theirs).all()):
        raise CheckFailed(f"timm's model gives features {tuple(theirs.shape)}, vitsinks' {tuple(ours.shape)}: "
                          f"nothing was written")
    diff = float((ours - theirs).abs().max())
    if diff > CHECK_RTOL * max(1.0, float(ours.abs().max())):
        raise CheckFailed(f"timm's model computes other features than vitsinks' (max |difference| {diff:.3g}): "
                          f"nothing was written")
    return diff
