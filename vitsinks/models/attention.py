"""One attention module family for every sink-mitigation variant.

`SinkAttention` keeps timm's parameter names (`qkv`, `q_norm`, `k_norm`, `norm`, `gate`, `proj`) so a timm
`VisionTransformer` state dict loads unchanged. It adds:

- a G1 output gate (Qiu et al. 2025): `Y' = Y * sigmoid(X W_g + b_g)` with X the block's pre-normed input,
  elementwise (`W_g`: dim x dim) or headwise (`W_g`: dim x heads);
- four attention nonlinearities: `softmax`, `relu` (`relu(s) / N`), `sigmoid` (`sigmoid(s - log N)`) and
  `sink_logit` (softmax with one extra, always-present key of zero value and a learnable per-head logit).

`internals(x)` is the single explicit computation: it returns the attention matrix A, the values v and the
gate. The non-fused forward is built on it, so the diagnostics read exactly the computation the model runs.
`redirected(x, head, sink)` is one head's attention with a key's share given to the other keys, computed from the
scores (the interventions' `redirect_sink_attention`).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from timm.layers import use_fused_attn
from torch import nn

from vitsinks.utils.errors import BadValue

GateKind = Literal["none", "elementwise", "headwise"]
AttnKind = Literal["softmax", "relu", "sigmoid", "sink_logit"]
GATES: tuple[str, ...] = ("none", "elementwise", "headwise")
ATTN_KINDS: tuple[str, ...] = ("softmax", "relu", "sigmoid", "sink_logit")
FUSED_KINDS: tuple[str, ...] = ("softmax", "sink_logit")

GATE_INIT_STD = 1e-6  # Kempner reference init: the gate starts (almost) input-independent ...
GATE_INIT_BIAS = 2.0  # ... and open at sigmoid(2) ~ 0.88.


class AttnInternals(NamedTuple):
    """Explicit internals of one attention call on a pre-normed input of N tokens.

    attn: (B, heads, N, N) after the nonlinearity (rows of `sink_logit` sum to < 1: the null key is dropped).
    v: (B, heads, N, head_dim) value vectors.
    gate: sigmoid gate values broadcastable to (B, N, heads, head_dim), i.e. (B, N, heads, head_dim) for the
        elementwise gate and (B, N, heads, 1) for the headwise gate; None without a gate.
    """

    attn: torch.Tensor
    v: torch.Tensor
    gate: torch.Tensor | None


class SinkAttention(nn.Module):
    """Multi-head self-attention with an optional G1 gate and a choice of attention nonlinearity."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        gate: GateKind = "none",
        attn: AttnKind = "softmax",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if dim % num_heads:
            raise BadValue(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        if gate not in GATES:
            raise BadValue(f"unknown gate {gate!r}; choose one of {GATES}")
        if attn not in ATTN_KINDS:
            raise BadValue(f"unknown attention kind {attn!r}; choose one of {ATTN_KINDS}")
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("qk_norm / scale_norm need a norm_layer")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.gate_kind = gate
        self.attn_kind = attn
        self.fused_attn = use_fused_attn()

        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim, **dd) if scale_norm else nn.Identity()
        gate_out = {"none": 0, "elementwise": dim, "headwise": num_heads}[gate]
        self.gate = nn.Linear(dim, gate_out, bias=True, **dd) if gate_out else None
        self.sink_logit = nn.Parameter(torch.zeros(num_heads, **dd)) if attn == "sink_logit" else None
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.init_weights()

    def init_weights(self) -> None:
        """Reference gate init (std 1e-6, bias 2). timm's ViT init calls this after initialising the Linears."""
        if self.gate is not None:
            nn.init.normal_(self.gate.weight, std=GATE_INIT_STD)
            nn.init.constant_(self.gate.bias, GATE_INIT_BIAS)
        if self.sink_logit is not None:
            nn.init.zeros_(self.sink_logit)

    @property
    def uses_fused(self) -> bool:
        """Whether the training forward goes through `scaled_dot_product_attention`."""
        return self.fused_attn and self.attn_kind in FUSED_KINDS

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return self.q_norm(q), self.k_norm(k), v

    def _gate(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.gate is None:
            return None
        B, N, _ = x.shape
        g = self.gate(x).sigmoid()
        return g.view(B, N, self.num_heads, -1)  # (.., head_dim) elementwise, (.., 1) headwise

    def _attention_matrix(self, q: torch.Tensor, k: torch.Tensor, causal: bool = False) -> torch.Tensor:
        n = k.shape[-2]
        s = (q * self.scale) @ k.transpose(-2, -1)
        future = torch.ones(n, n, dtype=torch.bool, device=s.device).triu_(1) if causal else None
        if self.attn_kind in ("softmax", "sink_logit"):
            if future is not None:
                s = s.masked_fill(future, float("-inf"))
            if self.attn_kind == "softmax":
                return s.softmax(dim=-1)
            # sink_logit: softmax over [scores, per-head null logit]; the null key has zero value, so drop it.
            null = self.sink_logit.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
            return torch.cat([s, null], dim=-1).softmax(dim=-1)[..., :-1]
        a = F.relu(s) / n if self.attn_kind == "relu" else torch.sigmoid(s - math.log(n))
        return a.masked_fill(future, 0.0) if future is not None else a

    def internals(self, x: torch.Tensor, causal: bool = False) -> AttnInternals:
        """Explicit attention matrix, values and gate for a pre-normed input `x` of shape (B, N, dim).

        `causal` masks future keys (used by the sequence tasks of `vitsinks.synthetic`; ViTs are bidirectional).
        """
        q, k, v = self._qkv(x)
        return AttnInternals(self._attention_matrix(q, k, causal), v, self._gate(x))

    def redirected(self, x: torch.Tensor, head: int, sink: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """Head `head`'s attention (B, N, N) on the pre-normed input `x` with the attention to key `sink[b]` of
        image b removed and given to the other keys, computed from the scores (not from A, whose entries off a
        strong sink underflow to exactly 0 in float32: a rescaled row would stay off instead of redirected).

        - softmax: the softmax of the scores with the sink key masked out (-inf);
        - sink_logit: the softmax over [scores, null logit] with the sink key masked out; the null key stays (the
          model's own off-switch takes its share) and its column is dropped, as in `internals`;
        - relu / sigmoid (rows not normalised): column s zeroed and the row rescaled to its old sum, the sigmoid's
          in log space (log A = logsigmoid, sums by logsumexp), so rows whose other weights underflow are still
          right. relu's zeros are exact: a row with no positive score off the sink stays 0.

        A row with no key left (a causal query that sees only the sink) is 0 for every kind."""
        q, k, _ = self._qkv(x)
        s = (q[:, head] * self.scale) @ k[:, head].transpose(-2, -1)  # (B, N, N), as in `_attention_matrix`
        B, n = s.shape[0], s.shape[-1]
        is_sink = torch.zeros_like(s, dtype=torch.bool)
        is_sink[torch.arange(B, device=s.device), :, sink] = True
        hidden = torch.zeros(n, n, dtype=torch.bool, device=s.device)  # future keys of a causal query
        if causal:
            hidden = hidden.logical_not_().triu_(1)
        off = is_sink | hidden
        if self.attn_kind == "softmax":
            masked = s.masked_fill(off, float("-inf"))
            empty = masked.amax(-1, keepdim=True) == float("-inf")
            return torch.where(empty, 0.0, masked.softmax(dim=-1))
        if self.attn_kind == "sink_logit":
            null = self.sink_logit[head].to(s.dtype).expand(*s.shape[:-1], 1)
            return torch.cat([s.masked_fill(off, float("-inf")), null], dim=-1).softmax(dim=-1)[..., :-1]
        if self.attn_kind == "relu":
            a = (F.relu(s) / n).masked_fill(hidden, 0.0)
            rest = a.masked_fill(is_sink, 0.0)
            total, kept = a.sum(-1, keepdim=True), rest.sum(-1, keepdim=True)
            return torch.where(kept == 0, 0.0, rest / kept * total)  # NaN stays NaN
        log_a = F.logsigmoid(s - math.log(n)).masked_fill(hidden, float("-inf"))  # sigmoid
        log_total = log_a.logsumexp(-1, keepdim=True)
        log_rest = log_a.masked_fill(is_sink, float("-inf"))
        log_kept = log_rest.logsumexp(-1, keepdim=True)
        return torch.where(log_kept == float("-inf"), 0.0, (log_rest + log_total - log_kept).exp())

    def combine(self, heads_out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """(B, heads, N, head_dim) per-head outputs -> (B, N, dim): scale-norm, gate, output projection."""
        B, H, N, D = heads_out.shape
        y = self.norm(heads_out.transpose(1, 2).reshape(B, N, H * D))
        if gate is not None:
            y = (y.view(B, N, H, D) * gate).view(B, N, H * D)
        return self.proj_drop(self.proj(y))

    def _fused_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        drop = self.attn_drop.p if self.training else 0.0
        if self.attn_kind == "softmax":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        # sink_logit: one extra key with zero value; q . 0 = 0, so an additive bias on that column sets its logit.
        B, H, N, D = k.shape
        zeros = k.new_zeros(B, H, 1, D)
        bias = torch.cat([k.new_zeros(1, H, 1, N), self.sink_logit.to(k.dtype).view(1, H, 1, 1)], dim=-1)
        return F.scaled_dot_product_attention(
            q, torch.cat([k, zeros], dim=2), torch.cat([v, zeros], dim=2), attn_mask=bias, dropout_p=drop
        )

    def heads(self, x: torch.Tensor, is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-head outputs (B, heads, N, head_dim), fused where possible, and the gate (see `AttnInternals`)."""
        if self.uses_fused and not is_causal:
            q, k, v = self._qkv(x)
            return self._fused_heads(q, k, v), self._gate(x)
        attn, v, gate = self.internals(x, causal=is_causal)
        return self.attn_drop(attn) @ v, gate

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None:
            raise NotImplementedError("SinkAttention takes no attention mask (is_causal is supported)")
        return self.combine(*self.heads(x, is_causal))
