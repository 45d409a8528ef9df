"""The explicit global pathway (docs/fidelity.md, the seed paper's Eqs. 4-5) and the common-mode penalty.

A block with a pathway computes, from the same pre-normed tokens z as its attention,

    pi_j = softmax_j(w_P . z_j),   g = sum_j pi_j W_VG z_j,   gamma_i = sigmoid(w_gamma . z_i + b_gamma)
    x_i <- x_i + ls1 * o_i^attn + ls3 * gamma_i W_OG g

a broadcast channel that needs no attention sink (w_P, W_VG, W_OG without biases, trunc-normal std 0.02; b_gamma = 0,
so gamma = 0.5 at init; ls3 LayerScale or none). The `hier` recipient gate is the reference's per-token
hierarchical gate: `[a_i, r_i0, r_ibc] = W_h z_i + b_h` (one Linear(dim, 3), trunc-normal 0.02, bias 0) and
`gamma_i = sigmoid(a_i) * softmax([r_i0, r_ibc])_bc`, a parent gate times a two-way choice between "no update" and
"the broadcast" (0.25 at init).

The common-mode penalty of a block's attention update o (B, N, dim) is E(mean_i o_i) / (E(o) + 1e-12), E the mean
squared entry: 0 for an update of zero mean over tokens, 1 for the same update at every token.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from timm.layers import LayerScale, trunc_normal_
from torch import nn

from vitsinks.utils.errors import BadValue

RecipientGate = Literal["learned", "hier"]
RECIPIENT_GATES: tuple[str, ...] = ("learned", "hier")
CM_EPS = 1e-12


class PathwayInternals(NamedTuple):
    """pi (B, N) pooling weights, g (B, state_dim) global state, gamma (B, N, 1) recipient gate, write (B, 1, dim)
    ls3 * W_OG g: the pathway's update of token i is gamma_i * write."""

    pi: torch.Tensor
    g: torch.Tensor
    gamma: torch.Tensor
    write: torch.Tensor


class GlobalPathway(nn.Module):
    """Attention-free broadcast: one softmax pool over the tokens into a `state_dim` state, written back to every
    token through a recipient gate.

    The maps of the tokens (pooling score w_P, the recipient gate's logits, state value W_VG) are the rows of one
    bias-free `inp` Linear (one matmul: the pathway is small, so kernel launches, not FLOPs, set its cost); the gate
    logits have their own bias `gamma_bias` (1 logit for `learned`, 3 for `hier`). `w_pool`, `w_gamma`, `w_value`
    name the rows.
    """

    GATE_LOGITS = {"learned": 1, "hier": 3}

    def __init__(self, dim: int, state_dim: int = 64, gate: RecipientGate = "learned",
                 init_values: float | None = None) -> None:
        super().__init__()
        if gate not in RECIPIENT_GATES:
            raise BadValue(f"unknown recipient gate {gate!r}; choose one of {RECIPIENT_GATES}")
        if state_dim < 1:
            raise BadValue(f"global pathway state_dim must be >= 1, got {state_dim}")
        self.gate_kind = gate
        self.n_gate = self.GATE_LOGITS[gate]
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


def common_mode_terms(o: torch.Tensor) -> torch.Tensor:
    """(E(mean_i o_i), E(o)) of an update o (B, N, dim) as a float32 tensor (2,), differentiable: the penalty's
    numerator and denominator, kept apart so that they can be summed over ranks before the ratio."""
    o = o.float()
    energy = torch.linalg.vector_norm(o).square() / o.numel()  # E(o) in one reduction, no o**2 tensor
    return torch.stack([o.mean(dim=1).square().mean(), energy])


def common_mode_penalty(o: torch.Tensor) -> torch.Tensor:
    """E(mean_i o_i) / (E(o) + 1e-12) of an update o (B, N, dim), in float32, differentiable through both terms."""
    num, den = common_mode_terms(o)
    return num / (den + CM_EPS)
