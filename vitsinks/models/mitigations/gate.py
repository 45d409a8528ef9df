"""The G1 output gate (Qiu et al. 2025): `Y' = Y * sigmoid(X W_g + b_g)` on the per-head attention outputs Y before
the output projection, X the block's pre-normed input; elementwise (`W_g`: dim x dim) or headwise (`W_g`: dim x
heads). Reference init (Kempner): weights normal std 1e-6, bias 2, so the gate starts (almost) input-independent and
open at sigmoid(2) ~ 0.88. Config: `model.gate=none|elementwise|headwise`; state dict: `attn.gate.*`."""

from __future__ import annotations

import dataclasses
import math
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from vitsinks.models.mitigations.mitigation import MITIGATIONS, BlockMitigation
from vitsinks.utils.columns import Column
from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only: the attention module imports the mitigations
    from vitsinks.models.attention import AttnInternals
    from vitsinks.models.seam import Block

Gate = StrEnum("Gate", "none elementwise headwise", module=__name__)
GATES: tuple[str, ...] = tuple(g.value for g in Gate)
GATE_INIT_STD = 1e-6  # Kempner reference init: the gate starts (almost) input-independent ...
GATE_INIT_BIAS = 2.0  # ... and open at sigmoid(2) ~ 0.88.


class G1Gate(nn.Linear):
    """The gate's Linear(dim, dim) (elementwise) or Linear(dim, heads) (headwise) on the pre-normed input."""

    def __init__(self, dim: int, num_heads: int, mode: str = "elementwise") -> None:
        if mode not in ("elementwise", "headwise"):
            raise BadValue(f"unknown gate {mode!r}; choose one of {GATES}")
        super().__init__(dim, dim if mode == "elementwise" else num_heads, bias=True)
        self.mode, self.num_heads = str(mode), num_heads
        self.init_weights()

    def init_weights(self) -> None:
        """Reference init (std 1e-6, bias 2); `SinkAttention.init_weights` calls it after timm's ViT init."""
        nn.init.normal_(self.weight, std=GATE_INIT_STD)
        nn.init.constant_(self.bias, GATE_INIT_BIAS)

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """sigmoid gate (B, N, heads, head_dim) elementwise, (B, N, heads, 1) headwise, for x (B, N, dim)."""
        B, N, _ = x.shape
        return self(x).sigmoid().view(B, N, self.num_heads, -1)


@MITIGATIONS.register
class G1GateMitigation(BlockMitigation):
    name = "gate"
    site = "heads"
    attr = "gate"
    columns = (Column("gate_mean", "mean gate", "mechanism", fmt=".2f",
                      doc="the attention gate's mean value, over tokens, heads and blocks"),)
    diagnostic_fields = {"gate_mean": math.nan}
    always_diagnosed = True
    edits = ("open_gate", "close_gate")
    example = "elementwise"
    hub_tag = "gated-attention"

    @classmethod
    def config_field(cls) -> tuple[Any, dataclasses.Field]:
        # dataclasses.field() is typed as its default, for class bodies
        return Gate, cast(dataclasses.Field, dataclasses.field(default=Gate.none))

    @classmethod
    def setting(cls, value: Any) -> str | None:
        value = "none" if value is None else str(value)
        if value not in GATES:
            raise BadValue(f"unknown gate {value!r}; choose one of {GATES}")
        return None if value == "none" else value

    @classmethod
    def tag(cls, setting: str | None) -> str | None:
        return {None: None, "elementwise": "gate", "headwise": "gate_headwise"}[setting]

    @classmethod
    def arch(cls, value: Any) -> str:
        return cls.setting(value) or "none"

    @classmethod
    def build(cls, setting: str, dim: int, num_heads: int) -> G1Gate:
        return G1Gate(dim, num_heads, setting)

    @classmethod
    def diagnostics(cls, block: Block, z: torch.Tensor, it: AttnInternals,
                    attn_energy: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """`gate_mean` (B, heads): each head's mean gate value over tokens (and channels)."""
        return None if it.gate is None else {"gate_mean": it.gate.float().mean(dim=-1).mean(dim=1)}

    @classmethod
    def edit(cls, name: str, it: AttnInternals, head: int) -> AttnInternals:
        """`open_gate` / `close_gate`: head `head`'s gate set to 1 / 0 on every token (the gate's own effect)."""
        assert it.gate is not None  # the gate's own edits: a gated block
        gate = it.gate.clone()
        gate[:, :, head] = 1.0 if name == "open_gate" else 0.0
        return it._replace(gate=gate)
