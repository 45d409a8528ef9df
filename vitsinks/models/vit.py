"""The ViT builder: timm's `VisionTransformer` of `SinkBlock`s, whose attention is a `SinkAttention` of a registered
kind with the registered block mitigations (`vitsinks.models.kinds`, `vitsinks.models.mitigations`)."""

from __future__ import annotations

import dataclasses
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from timm.layers import LayerNorm, resample_abs_pos_embed, trunc_normal_
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn
from torch.utils.hooks import RemovableHandle

from vitsinks.models.attention import AttnInternals, SinkAttention, attention_layer, set_fused_attention
from vitsinks.models.config import ArchitectureConfig, PatchEmbed, PosEmbed, config_values, variant_name
from vitsinks.models.kinds import ATTN_KINDS, DEFAULT_KIND, KINDS
from vitsinks.models.layout import KeyLayout
from vitsinks.models.mitigations import MITIGATIONS, at_site
from vitsinks.models.mlp import MLPParts, timm_mlp_parts
from vitsinks.models.rope import PatchRope
from vitsinks.models.weights import (
    DAMAGED,
    architecture,
    check_finite,
    hub_state_dict,
    key_differences,
    mismatch,
    state_dict_from_file,
)
from vitsinks.utils.errors import BadValue

PATCH_EMBEDS: tuple[str, ...] = tuple(p.value for p in PatchEmbed)
POS_EMBEDS: tuple[str, ...] = tuple(p.value for p in PosEmbed)
UPDATE_MITIGATIONS = at_site("update")
ATTENTION_MITIGATIONS = at_site("heads", "keys", "outputs", "mask")  # modules of the attention


@dataclass(frozen=True)
class SizeSpec:
    """Architecture defaults of one named size (timm's widths, depths and heads)."""

    embed_dim: int
    depth: int
    num_heads: int
    patch_size: int = 16
    img_size: int = 224


SIZES: dict[str, SizeSpec] = {
    "vit_mini": SizeSpec(embed_dim=128, depth=4, num_heads=4, patch_size=8, img_size=64),
    "vit_cpu": SizeSpec(embed_dim=192, depth=6, num_heads=3, patch_size=8, img_size=64),
    "vit_tiny": SizeSpec(embed_dim=192, depth=12, num_heads=3),
    "vit_small": SizeSpec(embed_dim=384, depth=12, num_heads=6),
    "vit_base": SizeSpec(embed_dim=768, depth=12, num_heads=12),
    "vit_large": SizeSpec(embed_dim=1024, depth=24, num_heads=16),
    "vit_huge": SizeSpec(embed_dim=1280, depth=32, num_heads=16, patch_size=14),
}


class NoMLP(nn.Module):
    """Stands in for a block's MLP (`mlp=False`, the sink tasks' attention-only blocks): adds exactly nothing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


UpdateHook = Callable[["SinkBlock", torch.Tensor, Callable[[], torch.Tensor]], None]


class UpdateSiteModule(Protocol):
    """The module of an update-site mitigation (`vitsinks.models.mitigations`): adds to the attention update o."""

    def add_to(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor: ...


class SinkBlock(Block):
    """timm's pre-norm `Block` whose attention is a `SinkAttention` of kind `attn` (with its `kind_settings`) with
    the attention's mitigations, and the update-site ones beside it, all by their config names (`gate="elementwise"`,
    ...); timm's `depth` is the block's index among `n_blocks`. Without update hooks and update-site modules it runs
    timm's own forward."""

    attn: SinkAttention

    def __init__(self, dim: int, num_heads: int, *, attn: str = DEFAULT_KIND,
                 kind_settings: Mapping[str, Any] | None = None, n_blocks: int = 1, **kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name in MITIGATIONS if name in kwargs}
        kwargs.pop("attn_layer", None)  # a VisionTransformer passes timm's default Attention
        heads = {m.name: m.setting(values.get(m.name)) for m in ATTENTION_MITIGATIONS}
        settings = {"kind_settings": tuple(sorted(kind_settings.items()))} if kind_settings else {}
        layer = attention_layer(attn, **settings, **{k: v for k, v in heads.items() if v is not None})
        super().__init__(dim, num_heads, attn_layer=layer, **kwargs)
        self.attn.place(int(kwargs.get("depth", 0)), n_blocks)  # timm's `depth`: the block's index
        for m in UPDATE_MITIGATIONS:
            setting = m.setting(values.get(m.name))
            setattr(self, m.attr, None if setting is None else m.build(setting, dim, num_heads))
        self._update_hooks: OrderedDict[int, UpdateHook] = OrderedDict()

    def register_update_hook(self, fn: UpdateHook) -> RemovableHandle:
        """Call `fn(block, update, pre_gate)` in every forward with the attention update `ls1 * attn(z)` (B, N, dim)
        before the update-site mitigations add to it; `pre_gate()` computes (lazily) that update without the gate."""
        handle = RemovableHandle(self._update_hooks)
        self._update_hooks[handle.id] = fn
        return handle

    def mlp_parts(self) -> MLPParts | None:
        """The MLP as the register neurons read it (`models.mlp`): timm's plain `Mlp` and `ls2`, else None."""
        return timm_mlp_parts(self)

    def mlp_out(self) -> nn.Module:
        """The module whose output is the whole MLP branch as it is added to the stream (`drop_path2`, after `ls2`)."""
        return self.drop_path2

    def linears(self) -> dict[str, nn.Linear]:
        """Every `nn.Linear` of the block by its path in it, in module order (W8A8's layers)."""
        return {name: mod for name, mod in self.named_modules() if isinstance(mod, nn.Linear)}

    def _update_modules(self) -> list[UpdateSiteModule]:
        return [mod for m in UPDATE_MITIGATIONS if (mod := getattr(self, m.attr, None)) is not None]

    def entering(self, update: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The attention update `ls1 * attn(z)` (B, N, dim) as it enters the residual stream: with what the
        update-site mitigations add to it (`z` the pre-normed input)."""
        for module in self._update_modules():
            update = module.add_to(update, z)
        return update

    def forward_explicit(self, x: torch.Tensor, causal: bool = False) -> tuple[torch.Tensor, AttnInternals]:
        """The block computed from the attention's explicit internals; returns (output, internals)."""
        it = self.attn.internals(self.norm1(x), causal=causal)
        return self.from_heads(x, self.attn.attn_drop(it.attn) @ it.v, it.gate), it

    def from_heads(self, x: torch.Tensor, heads_out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """The block's output for input `x` given its heads' outputs (B, heads, N, head_dim) and gate."""
        return self._finish(x, self.norm1(x), heads_out, gate)

    def _finish(self, x: torch.Tensor, z: torch.Tensor, heads_out: torch.Tensor,
                gate: torch.Tensor | None) -> torch.Tensor:
        update = self.ls1(self.attn.combine(heads_out, gate))
        if self._update_hooks:
            ungated: list[torch.Tensor] = []

            def pre_gate() -> torch.Tensor:
                if gate is None:
                    return update
                if not ungated:
                    ungated.append(self.ls1(self.attn.combine(heads_out, None)))
                return ungated[0]

            for fn in list(self._update_hooks.values()):
                fn(self, update, pre_gate)
        x = x + self.drop_path1(self.entering(update, z))  # one residual branch: stochastic depth drops it whole
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if not self._update_hooks and not self._update_modules():  # timm's own forward
            return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)
        if attn_mask is not None:
            raise NotImplementedError("SinkBlock takes no attention mask (is_causal is supported)")
        z = self.norm1(x)
        return self._finish(x, z, *self.attn.heads(z, is_causal))


class SinkViT(VisionTransformer):
    """timm `VisionTransformer` built from `SinkBlock`s (the arguments: `build_vit`).

    Registers follow Darcet et al. by default: R learned tokens after [CLS] without position embedding, so
    `pos_embed` covers [CLS] + patches whatever R is; `register_pos_embed=True` is timm's layout (the reference
    sweep's), where it also covers the registers. `load_timm_state_dict` converts timm's register layouts exactly.
    `rope=True` adds the 2D RoPE of the patch tokens (`models.rope`), one `PatchRope` every block's attention reads.
    """

    def __init__(self, *, attn: str = DEFAULT_KIND, kind_settings: Mapping[str, Any] | None = None, mlp: bool = True,
                 patch_embed: str = "learned", register_pos_embed: bool = False,
                 prefix_init_std: float | None = None, norm_eps: float | None = None, rope: bool = False,
                 **kwargs: Any) -> None:
        if not kwargs.get("class_token", True) or kwargs.get("no_embed_class", False):
            raise ValueError("vitsinks ViTs always have a [CLS] token with its own position embedding")
        if not mlp:
            kwargs["mlp_layer"] = NoMLP
        if norm_eps is not None:
            kwargs["norm_layer"] = partial(LayerNorm, eps=float(norm_eps))
        # the canonical setting of every mitigation (None: off), passed to every block by its config name
        settings = {name: m.setting(kwargs.pop(name, None)) for name, m in MITIGATIONS.items()}
        # a mitigation's own learned tokens (the cores) fill the register slots after [CLS]
        owners = {name: n for name, m in MITIGATIONS.items() if (n := m.prefix_tokens(settings[name]))}
        if owners:
            if kwargs.get("reg_tokens"):
                raise BadValue(f"model.{next(iter(owners))} puts its learned tokens in the register slots and "
                               f"model.registers={kwargs['reg_tokens']} does not stack with it: set model.registers=0")
            kwargs["reg_tokens"] = sum(owners.values())
        kind_settings = dict(kind_settings or {})
        KINDS[attn].settings(kind_settings)  # checked before any block is built
        depth = int(kwargs.get("depth", 12))
        placed = partial(SinkBlock, attn=attn, kind_settings=kind_settings, n_blocks=depth, **settings)
        # timm annotates block_fn as a class; it calls it (with `depth=i`, the block's index), so a partial of one
        super().__init__(block_fn=cast(type[nn.Module], placed), **kwargs)
        for i, blk in enumerate(self.blocks):  # whatever timm passed as `depth`: each block knows its index
            cast(SinkBlock, blk).attn.place(i, depth)
        self.attn_kind, self.kind_settings, self.mitigations = str(attn), kind_settings, settings
        self.mitigation_tokens = sum(owners.values())  # of the register slots, the mitigation's tokens
        self.register_pos_embed = bool(register_pos_embed)
        self.qk_norm = bool(kwargs.get("qk_norm", False))
        self.rope = PatchRope(self.embed_dim // int(kwargs.get("num_heads", 12)),
                              tuple(self.patch_embed.grid_size)) if rope else None
        if self.rope is not None:
            for blk in self.blocks:
                cast(SinkBlock, blk).attn.rope = self.rope
        # post-hoc edits (training-free methods) as (label, registers they added), named by `variant`
        self.edits: list[tuple[str, int]] = []
        problem = KINDS[attn].problem(KINDS[attn].settings(kind_settings), self.key_layout().n_keys)
        if problem:
            warnings.warn(problem, stacklevel=2)
        if patch_embed == "orthonormal":
            self._fix_patch_embed()
        if self.num_reg_tokens and self.pos_embed is not None and not self.register_pos_embed:
            self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, self.embed_dim))
            trunc_normal_(self.pos_embed, std=0.02)
        if prefix_init_std is not None:
            for token in (self.cls_token, self.reg_token):
                if token is not None:
                    trunc_normal_(token, std=prefix_init_std)
        elif owners and self.reg_token is not None:
            MITIGATIONS[next(iter(owners))].init_prefix(self.reg_token)

    def _fix_patch_embed(self) -> None:
        """A frozen, bias-free patch embedding with orthonormal columns, orthogonal to the all-ones direction: patch
        pixels enter the stream isometrically (targets on them embed exactly) and the pre-norm only rescales them."""
        proj = self.patch_embed.proj
        dim, feats = proj.out_channels, proj.weight[0].numel()
        if dim < feats + 1:
            raise BadValue(f"model.patch_embed=orthonormal needs embed_dim >= {feats + 1} (channels x patch "
                             f"pixels + 1), got {dim}: raise model.embed_dim or lower model.patch_size")
        w = torch.randn(dim, feats)
        w -= w.mean(0, keepdim=True)  # orthogonal to the all-ones vector ...
        w = torch.linalg.qr(w).Q  # ... and orthonormal (Q spans the same, centred, column space)
        proj.weight = nn.Parameter(w.reshape_as(proj.weight).contiguous(), requires_grad=False)
        proj.bias = None

    def embed_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Tokens entering block 0 (B, N, dim), as in `forward_features`."""
        return self.norm_pre(self.patch_drop(self._pos_embed(self.patch_embed(images))))

    @torch.no_grad()
    def embed_patches(self, pixels: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> patch embeddings (B, P, dim), without position embedding or prefix tokens."""
        x = self.patch_embed(pixels)
        return x.reshape(x.shape[0], -1, x.shape[-1])

    @property
    def variant(self) -> str:
        """The architecture's `variant_name`, then its post-hoc edits: `base + test-time register`."""
        trained = self.num_reg_tokens - self.mitigation_tokens - sum(added for _, added in self.edits)
        name = variant_name({"attn": self.attn_kind, "kind_settings": self.kind_settings, "registers": trained,
                             "qk_norm": self.qk_norm, "rope": self.rope is not None, **self.mitigations})
        return " + ".join([name, *(label for label, _ in self.edits)])

    def _num_patches(self, img_size: int | tuple[int, int] | None) -> int:
        if img_size is None:
            return self.patch_embed.num_patches
        rows, cols = self.grid((img_size, img_size) if isinstance(img_size, int) else img_size)
        return rows * cols

    def tokens_per_image(self, img_size: int | None = None) -> int:
        """Sequence length: 1 [CLS] + registers + patches (at `img_size`, default the model's)."""
        return self.num_prefix_tokens + self._num_patches(img_size)

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        # timm's private method, overridden: timm has no layout with registers outside the position embedding
        if self.rope is not None:  # the blocks' RoPE turns the patches of this batch's grid
            grid = x.shape[1:3] if x.ndim == 4 else self.patch_embed.grid_size
            self.rope.set_grid((int(grid[0]), int(grid[1])), self.num_prefix_tokens)
        if not self.num_reg_tokens or self.pos_embed is None or self.register_pos_embed:
            return super()._pos_embed(x)
        B = x.shape[0]
        pos = self.pos_embed
        if self.dynamic_img_size:
            _, H, W, C = x.shape
            if (H, W) != tuple(self.patch_embed.grid_size):
                pos = resample_abs_pos_embed(pos, new_size=(H, W), old_size=self.patch_embed.grid_size,
                                             num_prefix_tokens=1)
            x = x.reshape(B, -1, C)
        assert self.cls_token is not None and self.reg_token is not None  # always [CLS]; registers here
        cls = self.cls_token.expand(B, -1, -1) + pos[:, :1]
        x = torch.cat([cls, self.reg_token.expand(B, -1, -1), x + pos[:, 1:]], dim=1)
        return self.pos_drop(x)

    def grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """Patch rows and columns for images of `img_size` (H, W)."""
        ph, pw = self.patch_embed.patch_size
        return img_size[0] // ph, img_size[1] // pw

    def key_layout(self, img_size: int | tuple[int, int] | None = None) -> KeyLayout:
        """The key layout of the blocks' attention rows for images of `img_size` (default the model's)."""
        extra = cast(SinkBlock, self.blocks[0]).attn.extra_keys if len(self.blocks) else ()
        return KeyLayout(self.num_reg_tokens, self._num_patches(img_size), extra)

    def prefix_and_patches(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split (B, N, D) tokens into ([CLS] (B, D), registers (B, R, D), patches (B, P, D))."""
        r = self.num_reg_tokens
        return tokens[:, 0], tokens[:, 1 : 1 + r], tokens[:, 1 + r :]


def build_vit(size: str = "vit_small", *, img_size: int | None = None, patch_size: int | None = None,
              embed_dim: int | None = None, depth: int | None = None, num_heads: int | None = None,
              mlp_ratio: float = 4.0, qkv_bias: bool = True, proj_bias: bool = True, mlp: bool = True,
              patch_embed: str = "learned", pos_embed: str = "learn", layerscale_init: float | None = None,
              norm_eps: float | None = None, drop_path: float = 0.0, registers: int = 0,
              register_pos_embed: bool = False, prefix_init_std: float | None = None, attn: str = DEFAULT_KIND,
              kind_settings: Mapping[str, Any] | None = None, qk_norm: bool = False, rope: bool = False,
              num_classes: int = 0, global_pool: str = "token", dynamic_img_size: bool = True,
              **mitigations: Any) -> SinkViT:
    """Build a ViT of a named `size` (any field overridable) with the requested sink mitigations.

    The arguments are `ModelConfig`'s fields (docs/commands-options.md): `attn` a registered attention kind
    (`ATTN_KINDS`) with its `kind_settings` (by name; absent ones their defaults), `mitigations` by their config
    names (`gate="headwise"`, `global_pathway={...}`); `mlp=False`
    builds attention-only blocks; `patch_embed="orthonormal"` and `pos_embed="none"` are for the sink tasks;
    `prefix_init_std`: trunc-normal std of [CLS] and the registers and `norm_eps` every LayerNorm's eps (None: timm's
    init, 1e-6). `qk_norm` LayerNorms each head's q and k (timm's); `rope` turns the patches' q and k by their row
    and column (`models.rope`). `dynamic_img_size` lets multi-crop views of other sizes through (no parameter).
    """
    if size not in SIZES:
        raise BadValue(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    if attn not in KINDS:
        raise BadValue(f"unknown attention kind {attn!r}; choose one of {ATTN_KINDS}")
    unknown = set(mitigations) - set(MITIGATIONS)
    if unknown:
        raise TypeError(f"build_vit got unknown arguments {sorted(unknown)} (mitigations: {sorted(MITIGATIONS)})")
    if patch_embed not in PATCH_EMBEDS:
        raise BadValue(f"unknown patch embedding {patch_embed!r}; choose one of {PATCH_EMBEDS}")
    if pos_embed not in POS_EMBEDS:
        raise BadValue(f"unknown position embedding {pos_embed!r}; choose one of {POS_EMBEDS}")
    if registers < 0:
        raise BadValue(f"registers must be >= 0, got {registers}")
    spec = SIZES[size]
    return SinkViT(attn=str(attn), kind_settings=kind_settings, mlp=mlp, patch_embed=str(patch_embed),
                   register_pos_embed=register_pos_embed, qk_norm=bool(qk_norm), rope=bool(rope),
                   prefix_init_std=prefix_init_std, norm_eps=norm_eps, pos_embed=str(pos_embed), proj_bias=proj_bias,
                   img_size=img_size or spec.img_size, patch_size=patch_size or spec.patch_size,
                   embed_dim=embed_dim or spec.embed_dim, depth=depth or spec.depth,
                   num_heads=num_heads or spec.num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                   init_values=layerscale_init, drop_path_rate=drop_path, reg_tokens=registers,
                   num_classes=num_classes, global_pool=global_pool, dynamic_img_size=dynamic_img_size,
                   **{name: MITIGATIONS[name].setting(value) for name, value in mitigations.items()})


def load_timm_state_dict(model: SinkViT, state_dict: dict[str, torch.Tensor], strict: bool = True,
                         what: str = "the state dict") -> None:
    """Load a timm `VisionTransformer` state dict of the same configuration into `model`, exactly; one that does not
    fit is a one-line `BadValue` naming `what` and the architecture it holds against the model's. timm's position
    embedding layouts (with or without the prefix tokens) are mapped to the model's without changing its function;
    timm's `Attention(gated=True)` is the elementwise gate (a zero bias where timm's has none)."""
    sd = dict(state_dict)
    own = model.state_dict()
    for k, w in state_dict.items():
        bias = k.removesuffix("weight") + "bias"
        if k.endswith(".attn.gate.weight") and bias not in sd and bias in own:
            sd[bias] = w.new_zeros(own[bias].shape)
    if isinstance(model.head, nn.Identity):
        sd = {k: v for k, v in sd.items() if not k.startswith("head.")}
    pe = sd.get("pos_embed")
    if pe is not None and model.pos_embed is not None:
        n_patch, r = model.patch_embed.num_patches, model.num_reg_tokens
        if pe.shape[1] == model.pos_embed.shape[1]:  # the same layout
            pass
        elif pe.shape[1] == n_patch:  # no position embedding on prefix tokens: [CLS] gets a zero one
            sd["pos_embed"] = torch.cat([pe.new_zeros(1, 1, pe.shape[2]), pe], dim=1)
            if model.register_pos_embed and r:  # ... and the registers too
                sd["pos_embed"] = torch.cat([pe.new_zeros(1, 1 + r, pe.shape[2]), pe], dim=1)
        elif r and pe.shape[1] == n_patch + 1 + r and "reg_token" in sd:  # fold register positions into them
            sd["reg_token"] = sd["reg_token"] + pe[:, 1 : 1 + r]
            sd["pos_embed"] = torch.cat([pe[:, :1], pe[:, 1 + r :]], dim=1)
    try:
        model.load_state_dict(sd, strict=strict)
    except RuntimeError as err:
        heads = cast(SinkBlock, model.blocks[0]).attn.num_heads if len(model.blocks) else None
        asked = {**architecture(own), "heads": heads}
        keys = key_differences(sd, own)
        if not strict:
            keys = {"of another shape": keys["of another shape"]}
        raise BadValue(mismatch(what, architecture(sd), asked, keys)) from err


BUILD_ARGS = tuple(f.name for f in dataclasses.fields(ArchitectureConfig))  # `build_vit`'s arguments


def model_from_config(m: Any) -> SinkViT:
    """Build the ViT of a `ModelConfig` (or any mapping with its fields; absent ones the defaults) and load
    `m.pretrained` if set: a weights file or checkpoint, or a timm model name, of the same architecture."""
    given = config_values(m)
    values = {k: given[k] for k in (*BUILD_ARGS, *MITIGATIONS) if k in given}
    model = build_vit(values.pop("size", ArchitectureConfig.size), **values)
    set_fused_attention(model, str(given.get("fused_attention", "auto")))
    source = given.get("pretrained")
    if source:
        path = Path(source).expanduser()
        sd = state_dict_from_file(path) if path.is_file() else hub_state_dict(source)  # the hub: no retries offline
        check_finite(sd, f"model.pretrained={source}", DAMAGED)
        load_timm_state_dict(model, sd, what=f"model.pretrained={source}")
    return model
