"""The explicit global pathway beside attention in every block (docs/pathway.md; the seed paper's Eqs. 4-5): from the
same pre-normed tokens z as attention,

    pi_j = softmax_j(w_P . z_j),   g = sum_j pi_j W_VG z_j,   x_i <- x_i + ls1 * o_i^attn + ls3 * gamma_i W_OG g

with the recipient gate gamma_i = sigmoid(w_gamma . z_i + b_gamma) (`learned`) or the reference's hierarchical
sigmoid(a_i) * softmax([r_i0, r_ibc])_bc (`hier`). Config: `model.global_pathway.*`; state dict: `pathway.*`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import torch
from timm.layers import LayerScale, trunc_normal_
from torch import nn

from vitsinks.models.layout import KeyLayout
from vitsinks.models.mitigations.mitigation import MITIGATIONS, BlockMitigation
from vitsinks.utils.bounded import bounded
from vitsinks.utils.columns import Column
from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only: the attention module imports the mitigations
    from vitsinks.models.attention import AttnInternals
    from vitsinks.models.seam import Block

RecipientGate = StrEnum("RecipientGate", "learned hier", module=__name__)
RECIPIENT_GATES: tuple[str, ...] = tuple(g.value for g in RecipientGate)


@dataclass
class GlobalPathwayConfig:
    """The docs/fidelity.md global pathway beside attention in every block (`model.global_pathway`)."""

    enabled: bool = False
    state_dim: int = bounded(64, ge=1)  # d_g
    gate: RecipientGate = RecipientGate.learned  # learned: sigmoid(w . z_i + b); hier: sigmoid(a_i) * softmax(r_i)_bc
    layerscale_init: float | None = bounded(None, gt=0)  # ls3; None: no LayerScale on the pathway


DEFAULTS = GlobalPathwayConfig()


class PathwayInternals(NamedTuple):
    """pi (B, N) pooling weights, g (B, state_dim) global state, gamma (B, N, 1) recipient gate, write (B, 1, dim)
    ls3 * W_OG g: the pathway's update of token i is gamma_i * write."""

    pi: torch.Tensor
    g: torch.Tensor
    gamma: torch.Tensor
    write: torch.Tensor


class GlobalPathway(nn.Module):
    """Attention-free broadcast: one softmax pool over the tokens into a `state_dim` state, written back to every
    token through a recipient gate. w_P, the gate's logit rows and W_VG are the rows of one bias-free `inp` Linear
    (one matmul: kernel launches, not FLOPs, set its cost), named by `w_pool`, `w_gamma`, `w_value`; the gate logits
    have their own bias `gamma_bias` (1 logit for `learned`, 3 for `hier`)."""

    GATE_LOGITS = {"learned": 1, "hier": 3}

    def __init__(self, dim: int, state_dim: int = DEFAULTS.state_dim, gate: str = DEFAULTS.gate,
                 init_values: float | None = DEFAULTS.layerscale_init) -> None:
        super().__init__()
        if gate not in RECIPIENT_GATES:
            raise BadValue(f"unknown recipient gate {gate!r}; choose one of {RECIPIENT_GATES}")
        if state_dim < 1:
            raise BadValue(f"global pathway state_dim must be >= 1, got {state_dim}")
        self.gate_kind = str(gate)
        self.n_gate = self.GATE_LOGITS[self.gate_kind]
        self.inp = nn.Linear(dim, 1 + self.n_gate + state_dim, bias=False)  # rows: w_P, gate logits, W_VG
        self.gamma_bias = nn.Parameter(torch.zeros(self.n_gate))  # b_gamma (hier: b_a, b_r0, b_rbc)
        self.out = nn.Linear(state_dim, dim, bias=False)  # W_OG
        self.ls3 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.init_weights()

    @property
    def w_pool(self) -> torch.Tensor:
        return self.inp.weight[0]

    @property
    def w_gamma(self) -> torch.Tensor:
        """The recipient gate's logit rows ((1, dim) learned; (3, dim) hier: a, r_0, r_bc)."""
        return self.inp.weight[1 : 1 + self.n_gate]

    @property
    def w_value(self) -> torch.Tensor:
        return self.inp.weight[1 + self.n_gate :]

    def init_weights(self) -> None:
        """Trunc-normal std 0.02 weights, zero gate biases (gamma = 0.5 at init; hier: 0.25)."""
        for lin in (self.inp, self.out):
            trunc_normal_(lin.weight, std=0.02)
        nn.init.zeros_(self.gamma_bias)

    def recipient_gate(self, logits: torch.Tensor) -> torch.Tensor:
        """gamma (B, N, 1) from the gate logits (B, N, n_gate), in at least fp32."""
        logits = (logits + self.gamma_bias).float()
        if self.gate_kind == "learned":
            return logits.sigmoid()
        return logits[..., :1].sigmoid() * logits[..., 1:].softmax(dim=-1)[..., 1:2]

    def internals(self, z: torch.Tensor) -> PathwayInternals:
        """Everything the pathway computes on pre-normed tokens z (B, N, dim)."""
        h = self.inp(z)
        pi = h[..., 0].float().softmax(dim=-1).to(h.dtype)
        g = (pi.unsqueeze(1) @ h[..., 1 + self.n_gate :]).squeeze(1)
        gamma = self.recipient_gate(h[..., 1 : 1 + self.n_gate]).to(h.dtype)
        # ls3 * (gamma_i W_OG g) = gamma_i * (ls3 * W_OG g): LayerScale on the per-image write, before broadcasting
        return PathwayInternals(pi, g, gamma, self.ls3(self.out(g)).unsqueeze(1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """The pathway's update of the residual stream, (B, N, dim)."""
        it = self.internals(z)
        return it.gamma * it.write

    def add_to(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o + the pathway's update, in one fused multiply-add (what the block runs)."""
        it = self.internals(z)
        return torch.addcmul(o, it.gamma, it.write)


@MITIGATIONS.register
class GlobalPathwayMitigation(BlockMitigation):
    name = "global_pathway"
    site = "update"
    attr = "pathway"
    columns = (Column("pathway_share", "pathway share of update", "mechanism", fmt=".2f",
                      doc="the pathway's update energy over the attention's plus its own, mean over blocks"),)
    diagnostic_fields = {"pw_entropy": math.nan, "pw_top_token": -1.0, "pw_gamma": math.nan, "pw_share": math.nan}
    example = {"enabled": True}

    @classmethod
    def config_field(cls) -> tuple[Any, dataclasses.Field]:
        return GlobalPathwayConfig, cast(dataclasses.Field, dataclasses.field(default_factory=GlobalPathwayConfig))

    @classmethod
    def setting(cls, value: Any) -> GlobalPathwayConfig | None:
        """A `GlobalPathwayConfig` (or a mapping of its fields, missing ones the defaults; a mapping without
        `enabled` switches the pathway on), or None / False for none."""
        if value is None or value is False:
            return None
        if isinstance(value, GlobalPathwayConfig):
            return value if value.enabled else None
        if not isinstance(value, Mapping) and not hasattr(value, "items"):
            raise BadValue(f"model.global_pathway must be a mapping of {[f.name for f in dataclasses.fields(DEFAULTS)]}"
                           f", got {value!r}")
        fields = {f.name for f in dataclasses.fields(GlobalPathwayConfig)}
        unknown = set(value.keys()) - fields
        if unknown:
            raise BadValue(f"unknown global pathway settings {sorted(unknown)}; choose from {sorted(fields)}")
        cfg = GlobalPathwayConfig(**{"enabled": True, **dict(value.items())})
        return cfg if cfg.enabled else None

    @classmethod
    def tag(cls, setting: GlobalPathwayConfig | None) -> str | None:
        return None if setting is None else "global"

    @classmethod
    def arch(cls, value: Any) -> dict[str, Any]:
        s = cls.setting(value)
        if s is None:
            return {"enabled": False}
        return {"enabled": True, "state_dim": s.state_dim, "gate": str(s.gate), "layerscale_init": s.layerscale_init}

    @classmethod
    def build(cls, setting: GlobalPathwayConfig, dim: int, num_heads: int) -> GlobalPathway:
        return GlobalPathway(dim, state_dim=setting.state_dim, gate=setting.gate, init_values=setting.layerscale_init)

    @classmethod
    def diagnostics(cls, block: Block, z: torch.Tensor, it: AttnInternals,
                    attn_energy: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Per image (B,): `pw_entropy` of the pooling weights pi, `pw_top_token` (argmax pi), `pw_gamma` (mean
        recipient gate) and `pw_share` (its update's energy over the attention's plus its own)."""
        pathway = cast("GlobalPathway | None", getattr(block, cls.attr))  # set by `build` on every block (None: off)
        if pathway is None:
            return None
        pw = pathway.internals(z)
        energy = (pw.gamma * pw.write).float().square().mean(dim=(1, 2))
        return {"pw_entropy": -(pw.pi * pw.pi.clamp_min(1e-30).log()).sum(-1),
                "pw_top_token": pw.pi.argmax(-1).float(), "pw_gamma": pw.gamma.float().mean(dim=(1, 2)),
                "pw_share": energy / (energy + attn_energy).clamp_min(1e-30)}

    @classmethod
    def summarise(cls, d: Mapping[str, np.ndarray], layout: KeyLayout) -> dict[str, Any]:
        """`pathway`: per block its pooling entropy, where its top pooled token sits most often, its mean recipient
        gate and its share of the block update's energy (None in a block without the pathway)."""
        if "pw_share" not in d:
            return {}
        loc = layout.location_code(d["pw_top_token"].astype(int))
        has = ~np.isnan(d["pw_share"]).all(axis=0)

        def per_block(k: str) -> list[float | None]:
            return [float(np.round(x, 6)) if h else None for x, h in zip(d[k].mean(0), has, strict=True)]

        names = layout.locations
        return {"pathway": {
            "entropy_by_block": per_block("pw_entropy"),
            "top_token_by_block": [names[int(np.bincount(loc[:, b], minlength=len(names)).argmax())] if h else None
                                   for b, h in enumerate(has)],
            "gamma_mean_by_block": per_block("pw_gamma"),
            "share_by_block": per_block("pw_share"),
        }}

    @classmethod
    def leaderboard_values(cls, summary: Mapping[str, Any]) -> dict[str, float]:
        shares = [v for v in summary.get("pathway", {}).get("share_by_block", []) if v is not None]
        return {"pathway_share": float(np.mean(shares))} if shares else {}
