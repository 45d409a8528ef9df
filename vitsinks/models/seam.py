"""The model seam: one interface for every model the diagnostics, the interventions and the post-hoc methods read.

A `Backbone` is a model seen as images -> tokens entering block 0 (`embed`), its blocks (`Block`), the last residual
stream -> the final tokens (`readout`), the token layout ([CLS] (0 or 1), registers, patches) and, where the model has
one, a classifier. Every model family builds one (`vitsinks.backbones`); the synthetic tasks' sequence models build
one with `causal=True`. A `Block` runs its real forward, rebuilds itself from its explicit attention and from edited
head outputs, and names what the post-hoc edits reach (`mlp_parts`, `mlp_out`, `linears`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from vitsinks.models.attention import AttnInternals
from vitsinks.models.layout import KeyLayout
from vitsinks.models.mitigations import MITIGATIONS
from vitsinks.models.mlp import MLPParts
from vitsinks.utils.errors import BadValue


class Weighted(Protocol):
    """Something with a `.weight` (a linear layer, or a view of stacked projections)."""

    @property
    def weight(self) -> torch.Tensor: ...


class LinearSite(Weighted, Protocol):
    """A linear layer as W8A8 reads it (an `nn.Linear`, or a family's view of a fused projection): its `weight`, and
    a forward pre-hook on its input that may replace it."""

    def register_forward_pre_hook(self, hook: Callable[..., Any]) -> Any: ...


@runtime_checkable
class Attention(Protocol):
    """A block's self-attention as the seam reads it (see the module docstring); its attributes read-only."""

    @property
    def attn_kind(self) -> str: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def extra_keys(self) -> tuple[str, ...]: ...
    @property
    def qkv(self) -> Weighted: ...
    @property
    def proj(self) -> Weighted: ...

    def internals(self, x: torch.Tensor, causal: bool = False) -> AttnInternals: ...
    def redirected(self, x: torch.Tensor, head: int, sink: torch.Tensor, causal: bool = False) -> torch.Tensor: ...
    def combine(self, heads_out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor: ...


@runtime_checkable
class Block(Protocol):
    """A pre-norm transformer block x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x))), as the seam reads it; its
    attributes read-only (the model's own modules, or views of them)."""

    @property
    def attn(self) -> Any: ...  # an `Attention`; typed loosely so that nn.Module subclasses satisfy the protocol
    @property
    def norm1(self) -> nn.Module: ...
    @property
    def ls1(self) -> nn.Module: ...
    @property
    def norm2(self) -> nn.Module: ...
    @property
    def ls2(self) -> nn.Module: ...
    @property
    def mlp(self) -> nn.Module | None: ...

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor: ...
    def forward_explicit(self, x: torch.Tensor, causal: bool = False) -> tuple[torch.Tensor, AttnInternals]: ...
    def from_heads(self, x: torch.Tensor, heads_out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor: ...
    def entering(self, update: torch.Tensor, z: torch.Tensor) -> torch.Tensor: ...
    def mlp_parts(self) -> MLPParts | None: ...
    def mlp_out(self) -> nn.Module: ...
    def linears(self) -> Mapping[str, LinearSite]: ...


class AddedRegister(NamedTuple):
    """One register added to a model by its family (`Backbone.add_register`): the edited model's backbone, how many
    tokens its embedding made last, and the handles (`.remove()`) that take the register off again."""

    backbone: Backbone
    tokens: Callable[[], int]
    handles: list[Any]


@dataclass
class Backbone:
    """A model seen through the seam (see the module docstring). `model` is the module whose parameters, mode and
    device the backbone shares; `family` the adapter that built it."""

    model: nn.Module
    family: str
    blocks: list[Block]  # in order
    embed: Callable[[torch.Tensor], torch.Tensor]
    readout: Callable[[torch.Tensor], torch.Tensor]
    patch_size: tuple[int, int] = (1, 1)
    num_registers: int = 0
    num_cls: int = 1
    classifier: Callable[[torch.Tensor], torch.Tensor] | None = None
    name: str = "model"
    causal: bool = False
    # the family's way of adding a zero register after the prefix to the model itself, given the edit's label; None:
    # the embedding inserts it (the test-time register)
    add_register: Callable[[str], AddedRegister] | None = None

    def __post_init__(self) -> None:
        if self.num_cls not in (0, 1):
            raise BadValue(f"{self.name}: a model has 0 or 1 [CLS] tokens, not {self.num_cls}")

    # --- the token layout
    @property
    def num_prefix(self) -> int:
        """[CLS] and the registers: the tokens before the patches."""
        return self.num_cls + self.num_registers

    def grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """Patch rows and columns for images of `img_size` (H, W)."""
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def key_layout(self, img_size: tuple[int, int]) -> KeyLayout:
        """The `KeyLayout` of the blocks' attention rows: [CLS] (if any) | registers | patches | extra key slots."""
        extra = tuple(self.blocks[0].attn.extra_keys) if self.blocks else ()
        return KeyLayout(self.num_registers, int(np.prod(self.grid(img_size))), extra, self.num_cls)

    def layout_fields(self, img_size: tuple[int, int]) -> dict[str, np.ndarray]:
        """The layout as diagnostics fields (`KeyLayout.fields`, with `num_cls` always) and the patch `grid`."""
        return {**self.key_layout(img_size).fields(), "num_cls": np.array(self.num_cls),
                "grid": np.array(self.grid(img_size))}

    def without_registers(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens entering block 0 with the registers (after the `num_cls` [CLS]) removed."""
        c = self.num_cls
        return torch.cat([tokens[:, :c], tokens[:, c + self.num_registers :]], dim=1)

    # --- what the blocks are
    @property
    def mitigations(self) -> tuple[str, ...]:
        """The registered block mitigations some block has."""
        return tuple(name for name, m in MITIGATIONS.items() if any(m.present(b) for b in self.blocks))

    @property
    def attn_kinds(self) -> tuple[str, ...]:
        """The attention kinds of the blocks, each once, in block order."""
        return tuple(dict.fromkeys(b.attn.attn_kind for b in self.blocks))

    def heads(self, block: int) -> int:
        """The number of heads of block `block`."""
        return int(self.blocks[block].attn.num_heads)

    # --- running it
    def embed_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """The tokens entering block 0; images the embedding cannot take are a `BadValue`."""
        try:
            return self.embed(images)
        except (AssertionError, RuntimeError, ValueError) as e:  # timm asserts the size, convolutions raise
            if isinstance(e, torch.OutOfMemoryError):
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BadValue(f"{self.name} cannot embed inputs of shape {tuple(images.shape)} ({first}): give inputs "
                           f"preprocessed for the model (pretrained.load(...).images, or its library's "
                           f"transform)") from e

    def block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Block `index`'s own (fused) forward."""
        blk = self.blocks[index]
        return blk(x, is_causal=True) if self.causal else blk(x)

    def run(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The residual stream after the last block, from `x` entering block `start`."""
        for i in range(start, len(self.blocks)):
            x = self.block(i, x)
        return x

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """The final tokens: the embedding, every block's real forward, the readout."""
        return self.readout(self.run(self.embed_tokens(images)))

    # --- the module's mode and parameters
    @property
    def training(self) -> bool:
        """The model's training flag."""
        return self.model.training

    def train(self, mode: bool = True) -> Backbone:
        """Set the model's training mode."""
        self.model.train(mode)
        return self

    def eval(self) -> Backbone:
        """Evaluation mode (the explicit recomputations need it)."""
        return self.train(False)

    def parameters(self) -> Iterator[nn.Parameter]:
        """The model's parameters."""
        return self.model.parameters()
