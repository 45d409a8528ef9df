"""Views of a foreign (unmodified, pretrained) ViT that quack like vitsinks' own `SinkBlock` / `SinkAttention`.

The diagnostics (`diagnostics.core.diagnose_tokens`) and the interventions (`interventions.engine`) read a block as

- `blk(x)`: the block's real forward (fused SDPA or whatever the library runs), which moves the residual stream on;
- `blk.forward_explicit(x)` -> (out, `AttnInternals`): the same block rebuilt from the explicit attention matrix
  A, the values v and the gate, recomputed from the module's own q, k, v parameters (a fused kernel never
  materialises A); `recompute_error` checks that `out` equals the real forward;
- `blk.norm1`, `blk.ls1` (with `gamma` where the model has LayerScale), `blk.mlp`, `blk.norm2`, `blk.ls2`,
  `blk.mlp_parts()` (the register neurons: `models.mlp.MLPParts`),
  `blk.from_heads(x, heads_out, gate)` (the block from edited head outputs);
- `blk.attn`: `num_heads`, `head_dim`, `proj.weight` (dim, heads * head_dim), `qkv.weight` (3 * dim, dim: q rows,
  then k, then v; the QK spectrum), `extra_keys` (none), `attn_kind` ("softmax"), `internals`, `redirected`, `combine`.

A family module (`vitsinks.pretrained.families`) subclasses `AttentionView` (`_qkv`, `qkv_weight`, optionally
`_gate`) and `BlockView` (`real_forward`, `mlp_residual`, `mlp_parts`, optionally `linears`; `norm2` and `ls2`)
over its library's modules; nothing is copied or converted: the views call the model's own submodules and read their
parameters. Views assume evaluation mode (dropout and stochastic depth off), as every analysis pass sets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from vitsinks.interventions.subject import Subject
from vitsinks.models.attention import AttnInternals
from vitsinks.models.kinds import KINDS, AttentionKind
from vitsinks.models.layout import KeyLayout
from vitsinks.models.mlp import MLPParts
from vitsinks.quant.stats import LinearSite
from vitsinks.utils.errors import BadValue


@dataclass(frozen=True)
class WeightView:
    """Something with a `.weight`, where the diagnostics read `blk.attn.qkv.weight` of a model with separate q, k, v
    projections (the three weights stacked, q first)."""

    weight: torch.Tensor


class LayerScaleView(nn.Module):
    """A per-channel scale `gamma` (the model's own parameter, e.g. transformers' `lambda1`) as timm's LayerScale."""

    def __init__(self, gamma: torch.Tensor) -> None:
        super().__init__()
        self.gamma = gamma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class GridRope:
    """The rotary position embedding (RoPE) of the batch the view's embedding saw last, as the model's own forward
    computes it for that batch's grid and hands it to every block. A block's tokens do not tell the grid (N = prefix
    + rows * cols), so the embedding keeps it here for the block views (`value`, covering `patches` tokens: the last
    ones). `get(n)` refuses a sequence of n tokens that it does not cover with `max_prefix` or fewer tokens before the
    patches (a stale embedding of another image size)."""

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
                           f"not a sequence of {tokens} tokens: embed the images with the view (Foreign.embed) first")
        return self.value, prefix


class AttentionView(nn.Module):
    """A foreign softmax self-attention seen as a `SinkAttention` (see the module docstring). Subclasses give the
    per-head q, k, v of a pre-normed input (`_qkv`, after any q/k norm), the stacked projection weight
    (`qkv_weight`) and, where the model has one, the per-head output gate (`_gate`)."""

    attn_kind: ClassVar[str] = "softmax"
    kind: ClassVar[type[AttentionKind]] = KINDS["softmax"]
    extra_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, num_heads: int, head_dim: int, proj: nn.Module, scale: float | None = None,
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
        if causal:
            raise BadValue("pretrained ViTs are bidirectional: no causal attention")
        q, k, v = self._qkv(z)
        s = (q * self.scale) @ k.transpose(-2, -1)
        return AttnInternals(self.kind.matrix(self, s, None), v, self._gate(z))

    def redirected(self, z: torch.Tensor, head: int, sink: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """Head `head`'s attention (B, N, N) with key `sink[b]` masked out of image b's scores (the redirect edit,
        as `SinkAttention.redirected`)."""
        if causal:
            raise BadValue("pretrained ViTs are bidirectional: no causal attention")
        q, k, _ = self._qkv(z)
        s = (q[:, head] * self.scale) @ k[:, head].transpose(-2, -1)
        B, n, keys = s.shape
        is_sink = torch.zeros(B, n, keys, dtype=torch.bool, device=s.device)
        is_sink[torch.arange(B, device=s.device), :, sink] = True
        hidden = torch.zeros(n, keys, dtype=torch.bool, device=s.device)
        return self.kind.redirected(self, s, head, is_sink, hidden)

    def combine(self, heads_out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """(B, heads, N, head_dim) -> (B, N, dim): merge the heads, the model's output norm if any, gate, output
        projection."""
        B, H, N, D = heads_out.shape
        y = self.out_norm(heads_out.transpose(1, 2).reshape(B, N, H * D))
        if gate is not None:
            y = (y.view(B, N, H, D) * gate).view(B, N, H * D)
        return self.proj(y)


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
    """A foreign pre-norm block x + ls1(attn(norm1(x))), then its MLP residual, seen as a `SinkBlock`. Subclasses
    give the real forward (`real_forward`) and the second residual branch (`mlp_residual`)."""

    def __init__(self, block: nn.Module, attn: AttentionView, norm1: nn.Module, ls1: nn.Module | None = None,
                 mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.block, self.attn, self.norm1 = block, attn, norm1
        self.ls1 = nn.Identity() if ls1 is None else ls1
        self.mlp = mlp

    def real_forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mlp_residual(self, x: torch.Tensor) -> torch.Tensor:
        """x + the MLP branch (x: the stream after the attention residual)."""
        raise NotImplementedError

    def mlp_parts(self) -> MLPParts | None:
        """The MLP as the register neurons read it (`models.mlp.MLPParts`: input layer, activation, output layer,
        LayerScale gain); None for an MLP that is no plain one (this default: a family gives its own)."""
        return None

    def linears(self) -> dict[str, LinearSite]:
        """The block's linear layers for W8A8 by their path in the block, in module order: every `nn.Linear` of the
        model's block (`own_linears`). A family whose projections are no `nn.Linear` overrides it (open_clip)."""
        return own_linears(self.block)

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        if is_causal:
            raise BadValue("pretrained ViTs are bidirectional: no causal attention")
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


@dataclass
class Foreign:
    """A pretrained model seen through views: `blocks` (`BlockView`s, in order), `embed` (images -> tokens entering
    block 0), `readout` (the last block's output -> the final tokens), the token layout (`num_cls` [CLS] tokens
    (0 or 1), `num_registers`, then the patches of a grid of `patch_size` cells), and `classifier` (final tokens ->
    logits) where the model has a head."""

    model: nn.Module
    family: str
    blocks: list[BlockView]
    embed: Callable[[torch.Tensor], torch.Tensor]
    readout: Callable[[torch.Tensor], torch.Tensor]
    patch_size: tuple[int, int]
    num_registers: int = 0
    num_cls: int = 1
    classifier: Callable[[torch.Tensor], torch.Tensor] | None = None
    name: str = "pretrained"

    @property
    def num_prefix(self) -> int:
        """[CLS] and the registers: the tokens before the patches."""
        return self.num_cls + self.num_registers

    def grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """Patch rows and columns for images of `img_size` (H, W)."""
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def key_layout(self, img_size: tuple[int, int]) -> KeyLayout:
        """The `KeyLayout` of the blocks' attention rows: [CLS] (if the model has one) | registers | patches | the
        extra key slots (a `SinkViT`'s; a foreign model has none)."""
        extra = tuple(self.blocks[0].attn.extra_keys) if self.blocks else ()
        return KeyLayout(self.num_registers, int(np.prod(self.grid(img_size))), extra, self.num_cls)

    def layout_fields(self, img_size: tuple[int, int]) -> dict[str, np.ndarray]:
        """The layout as diagnostics fields (`KeyLayout.fields`, with `num_cls` always) and the patch `grid`."""
        return {**self.key_layout(img_size).fields(), "num_cls": np.array(self.num_cls),
                "grid": np.array(self.grid(img_size))}

    def subject(self) -> Subject:
        """The model as an interventions `Subject` (its [CLS], if any, first; the model in evaluation mode)."""
        self.model.eval()
        return Subject(list(self.blocks), self.embed_tokens, self.readout, self.num_prefix, self.num_registers,
                       classifier=self.classifier, name=self.name, num_cls=self.num_cls)

    # The names of a `SinkViT` that `vitsinks.diagnostics` reads (`core.Diagnosable`): the CLI's diagnosis, its
    # files, plots and page take a Foreign as they take vitsinks' own ViT.
    @property
    def num_prefix_tokens(self) -> int:
        """`num_prefix` under a `SinkViT`'s name."""
        return self.num_prefix

    @property
    def variant(self) -> str:
        """The model's name (the pages' title)."""
        return self.name

    @property
    def training(self) -> bool:
        """The model's training flag."""
        return self.model.training

    def train(self, mode: bool = True) -> Foreign:
        """Set the model's training mode."""
        self.model.train(mode)
        return self

    def eval(self) -> Foreign:
        """Evaluation mode (the views need it)."""
        return self.train(False)

    def parameters(self) -> Iterator[nn.Parameter]:
        """The model's parameters."""
        return self.model.parameters()

    def embed_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """The tokens entering block 0 (`embed`); images the model's embedding cannot take (another size or channel
        count than it was built for) are a `BadValue`."""
        try:
            return self.embed(images)
        except (AssertionError, RuntimeError, ValueError) as e:  # timm asserts the size, convolutions raise
            if isinstance(e, torch.OutOfMemoryError):
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BadValue(f"{self.name} cannot embed images of shape {tuple(images.shape)} ({first}): give images "
                           f"preprocessed for the model (pretrained.load(...).images, or its library's "
                           f"transform)") from e

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """The final tokens: the embedding, every block's real forward, the readout."""
        x = self.embed_tokens(images)
        for blk in self.blocks:
            x = blk(x)
        return self.readout(x)
