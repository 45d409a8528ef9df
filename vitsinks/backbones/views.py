"""The base views through which a foreign (unmodified, pretrained) ViT's blocks are the seam's `Block` and `Attention`
(`vitsinks.models.seam`). A family module subclasses `AttentionView` and `BlockView` over its library's modules
(docs/pretrained.md); nothing is copied or converted: the views call the model's own submodules and read their
parameters. They assume evaluation mode (dropout and stochastic depth off).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
from torch import nn

from vitsinks.models.attention import AttnInternals, merge_heads
from vitsinks.models.kinds import KINDS, AttentionKind
from vitsinks.models.mlp import MLPParts
from vitsinks.models.seam import LinearSite
from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only
    from vitsinks.models.attention import SinkAttention


@dataclass(frozen=True)
class WeightView:
    """A `.weight` for `blk.attn.qkv.weight` of a model with separate q, k, v projections (stacked, q first)."""

    weight: torch.Tensor


class LayerScaleView(nn.Module):
    """A per-channel scale `gamma` (the model's own parameter, e.g. transformers' `lambda1`) as timm's LayerScale."""

    def __init__(self, gamma: torch.Tensor) -> None:
        super().__init__()
        self.gamma = gamma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class GridRope:
    """The rotary position embedding (RoPE) of the batch the view's embedding saw last, kept for the block views (a
    block's tokens do not tell the grid). `get(n)` refuses a sequence it does not cover with at most `max_prefix`
    tokens before the `patches` (a stale embedding of another image size)."""

    def __init__(self, max_prefix: int) -> None:
        self.max_prefix = int(max_prefix)
        self.value: Any = None
        self.patches = 0

    def set(self, value: Any, patches: int) -> None:
        """Keep the embedding of the batch just embedded, over its `patches` patch tokens."""
        self.value, self.patches = value, int(patches)

    def get(self, tokens: int) -> tuple[Any, int]:
        """(the embedding, the number of tokens before the patches) for a sequence of `tokens` tokens."""
        prefix = tokens - self.patches
        if self.value is None or not 0 <= prefix <= self.max_prefix:
            raise BadValue(f"the rotary position embedding kept by the view's embedding covers {self.patches} patches, "
                           f"not a sequence of {tokens} tokens: embed the images with the backbone (Backbone.embed) "
                           f"first")
        return self.value, prefix


def bidirectional(causal: bool) -> None:
    """A `BadValue` for causal attention (pretrained ViTs have none)."""
    if causal:
        raise BadValue("pretrained ViTs are bidirectional: no causal attention")


class AttentionView(nn.Module):
    """A foreign softmax self-attention seen as a `SinkAttention`; subclasses give `_qkv`, `qkv_weight`, `_gate`."""

    attn_kind: ClassVar[str] = "softmax"
    kind: ClassVar[type[AttentionKind]] = KINDS["softmax"]
    extra_keys: ClassVar[tuple[str, ...]] = ()

    proj: nn.Linear  # the model's output projection

    def __init__(self, num_heads: int, head_dim: int, proj: nn.Linear, scale: float | None = None,
                 out_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.num_heads, self.head_dim = int(num_heads), int(head_dim)
        self.scale = float(head_dim**-0.5 if scale is None else scale)
        self.proj = proj
        self.out_norm = nn.Identity() if out_norm is None else out_norm
        self.gate: nn.Module | None = None  # the model's output gate, if any (the gate mitigation reads `attn.gate`)

    @property
    def qkv(self) -> WeightView:
        return WeightView(self.qkv_weight())

    def qkv_weight(self) -> torch.Tensor:
        """(3 * heads * head_dim, dim): the q, k and v projection weights stacked in this order."""
        raise NotImplementedError

    def _qkv(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, heads, N, head_dim) of a pre-normed input `z` (B, N, dim), q and k after any q/k norm."""
        raise NotImplementedError

    def _gate(self, z: torch.Tensor) -> torch.Tensor | None:
        """The output gate broadcastable to (B, N, heads, head_dim), or None."""
        return None

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, N, heads * head_dim) -> (B, heads, N, head_dim)."""
        B, N, _ = t.shape
        return t.view(B, N, self.num_heads, self.head_dim).transpose(1, 2)

    def internals(self, z: torch.Tensor, causal: bool = False) -> AttnInternals:
        """Explicit attention matrix (B, heads, N, N), values and gate for a pre-normed input `z`."""
        bidirectional(causal)
        q, k, v = self._qkv(z)
        s = (q * self.scale) @ k.transpose(-2, -1)
        # the kinds take a `SinkAttention`; softmax reads nothing off it
        return AttnInternals(self.kind.matrix(cast("SinkAttention", self), s, None), v, self._gate(z))

    def redirected(self, z: torch.Tensor, head: int, sink: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """Head `head`'s attention (B, N, N) with key `sink[b]` redirected, as `SinkAttention.redirected`."""
        bidirectional(causal)
        q, k, _ = self._qkv(z)
        s = (q[:, head] * self.scale) @ k[:, head].transpose(-2, -1)
        B, n, keys = s.shape
        is_sink = torch.zeros(B, n, keys, dtype=torch.bool, device=s.device)
        is_sink[torch.arange(B, device=s.device), :, sink] = True
        hidden = torch.zeros(n, keys, dtype=torch.bool, device=s.device)
        return self.kind.redirected(cast("SinkAttention", self), s, head, is_sink, hidden)  # as in `internals`

    def combine(self, heads_out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """(B, heads, N, head_dim) -> (B, N, dim): merged heads, output norm, gate, output projection."""
        return self.proj(merge_heads(heads_out, gate, self.out_norm))


def own_linears(block: nn.Module) -> dict[str, nn.Linear]:
    """Every `nn.Linear` inside a block by its path in it, in module order (W8A8's layers). A `BadValue` for a block
    holding an `nn.MultiheadAttention` whose view does not give its projections (`BlockView.linears`): its q, k, v
    projection is no `nn.Linear` and its fused path never calls `out_proj`."""
    named = list(block.named_modules())
    fused = [name for name, mod in named if isinstance(mod, nn.MultiheadAttention)]
    if fused:
        raise BadValue(f"{fused[0]} is an nn.MultiheadAttention: its q, k, v projection (in_proj_weight) is no "
                       f"nn.Linear and its fused path never calls out_proj; this view does not give them to W8A8")
    return {name: mod for name, mod in named if isinstance(mod, nn.Linear)}


class BlockView(nn.Module):
    """A foreign pre-norm block x + ls1(attn(norm1(x))), then its MLP residual, seen as a `SinkBlock`. `branch`: the
    model's module whose output is the whole MLP branch as it is added to the stream (`mlp_out`; default the MLP)."""

    norm2: nn.Module
    ls2: nn.Module

    def __init__(self, block: nn.Module, attn: AttentionView, norm1: nn.Module, ls1: nn.Module | None = None,
                 mlp: nn.Module | None = None, branch: nn.Module | None = None) -> None:
        super().__init__()
        self.block: Any = block  # typed loosely: a family reads its submodules by their library names
        self.attn, self.norm1 = attn, norm1
        self.ls1 = nn.Identity() if ls1 is None else ls1
        self.mlp = mlp
        self.branch = branch

    def real_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The library's own forward of the block."""
        return self.block(x)

    def mlp_residual(self, x: torch.Tensor) -> torch.Tensor:
        """x + the MLP branch (x: the stream after the attention residual), through the model's own `branch`."""
        if self.mlp is None:
            return x
        y = self.mlp(self.norm2(x))
        return x + (y if self.branch is None else self.branch(y))

    def mlp_parts(self) -> MLPParts | None:
        """The MLP as the register neurons read it (`models.mlp.MLPParts`); None for no plain MLP (this default)."""
        return None

    def mlp_out(self) -> nn.Module:
        """The model's module whose output is the block's whole MLP branch, as it is added to the stream."""
        out = self.branch if self.branch is not None else self.mlp
        if out is None:
            raise BadValue(f"the {type(self.block).__name__} has no MLP branch")
        return out

    def linears(self) -> Mapping[str, LinearSite]:
        """The block's linear layers for W8A8 by their path in the block (`own_linears`)."""
        return own_linears(self.block)

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        bidirectional(is_causal)
        return self.real_forward(x)

    def forward_explicit(self, x: torch.Tensor, causal: bool = False) -> tuple[torch.Tensor, AttnInternals]:
        """The block computed from its explicit attention internals; returns (output, internals)."""
        if self.block.training:
            raise BadValue("the views of a pretrained model need evaluation mode (model.eval()): dropout and "
                           "stochastic depth are not recomputed")
        it = self.attn.internals(self.norm1(x), causal=causal)
        return self.from_heads(x, it.attn @ it.v, it.gate), it

    def from_heads(self, x: torch.Tensor, heads_out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """The block's output for input `x` given its heads' outputs (B, heads, N, head_dim) and gate."""
        return self.mlp_residual(x + self.ls1(self.attn.combine(heads_out, gate)))

    def entering(self, update: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The attention update as it enters the residual stream: unchanged (no update-site module)."""
        return update
