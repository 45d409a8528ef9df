"""The attention kind's interface (`AttentionKind`), its registry (`KINDS`) and FlexAttention's (out, lse). A kind
says how a head's scores become its attention matrix, its fused paths if any, the parameters it adds, the redirect
edit and its formula written out naively (`reference`, for the tests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, cast

import torch
from torch import nn
from torch.nn.attention.flex_attention import AuxOutput, AuxRequest, flex_attention

from vitsinks.utils.errors import BadValue
from vitsinks.utils.registry import Registry

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention

DEFAULT_KIND = "softmax"
# The smallest normal float32: log-weight score mods treat weights below it as exact zeros (-inf), so that their
# gradient 1 / weight stays finite.
TINY = torch.finfo(torch.float32).tiny
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
FlexWithAux = Callable[..., tuple[torch.Tensor, AuxOutput]]  # `flex_attention` called with `return_aux`


@functools.cache
def _compiled_flex() -> FlexWithAux:
    return cast(FlexWithAux, torch.compile(flex_attention, dynamic=False))


def flex_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
             score_mod: ScoreMod | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention's (out, lse): out_i = sum_j softmax_j(w_ij) v_j and lse_i = log sum_j exp(w_ij) (float32 or
    wider) for w = score_mod(scale q k^T); an all -inf row gives out 0, lse -inf. So weights a_ij = exp(w_ij) give
    sum_j a_ij v_j = out * exp(lse). On CUDA the compiled kernel, elsewhere the eager reference (no backward on CPU);
    q and k are cast to v's dtype, as SDPA under autocast."""
    q, k = q.to(v.dtype), k.to(v.dtype)
    fn = _compiled_flex() if q.is_cuda else cast(FlexWithAux, flex_attention)
    try:
        out, aux = fn(q, k, v, score_mod=score_mod, scale=scale, return_aux=AuxRequest(lse=True))
    except NotImplementedError as err:  # e.g. no backward on CPU
        raise BadValue(f"FlexAttention on {q.device.type}: {err} (model.fused_attention=flex; use auto, sdpa or "
                       f"off there)") from err
    assert aux.lse is not None  # asked for by AuxRequest(lse=True)
    return out, aux.lse.to(torch.promote_types(aux.lse.dtype, torch.float32))


class AttentionKind:
    """How a head turns scores into attention; methods take the `SinkAttention` (`attn`) for its parameters."""

    name: ClassVar[str]
    normalised: ClassVar[bool] = True  # every row sums to 1 (the null key's share included)
    fused: ClassVar[bool] = False  # has a `scaled_dot_product_attention` path (`fused_heads`)
    flex: ClassVar[bool] = False  # has an exact FlexAttention path (`flex_heads`; CUDA for training)
    null_key: ClassVar[bool] = False  # an always-present key of value 0: the last slot of the key layout

    @staticmethod
    def parameters(num_heads: int, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> dict[str, nn.Parameter]:
        """Extra parameters registered on the attention module under these names."""
        return {}

    @staticmethod
    def init_parameters(attn: SinkAttention) -> None:
        """Deterministic init of the extra parameters (called by `SinkAttention.init_weights`)."""

    @staticmethod
    def matrix(attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        """Attention (B, heads, N, K) from the scaled scores `s` (B, heads, N, K'); `future` (N, K') marks keys a
        causal query may not see (None: bidirectional). K = K' + 1 with a `null_key` (its column last), else K'."""
        raise NotImplementedError

    @staticmethod
    def fused_heads(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    dropout_p: float) -> torch.Tensor:
        """Per-head outputs (B, heads, N, head_dim) through SDPA (only kinds with `fused`)."""
        raise NotImplementedError

    @staticmethod
    def flex_heads(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Per-head outputs (B, heads, N, head_dim) in v's dtype through FlexAttention, bidirectional, without
        dropout, `matrix(...) @ v` up to rounding (only kinds with `flex`)."""
        raise NotImplementedError

    @staticmethod
    def redirected(attn: SinkAttention, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """Head `head`'s attention (B, N, K) from its scores `s` (B, N, K') with the sink key (`is_sink`, (B, N, K))
        removed and its share given to the other keys; `hidden` (N, K) marks future keys. A row with no key left is
        0."""
        raise NotImplementedError

    @staticmethod
    def reference(attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        """The kind's formula written out naively on one query's visible scores `s` (K,) of head `head` in a sequence
        of `n` tokens, in float64: the tests' independent truth (a `null_key`'s share last)."""
        raise NotImplementedError


KINDS: Registry[type[AttentionKind]] = Registry(
    "attention kind", "an `AttentionKind` registered with `@KINDS.register` in a module of "
    "vitsinks/models/kinds/ (docs/extending.md)")


def kind_names(flag: str = "") -> tuple[str, ...]:
    """The registered kinds, the default first, then by name; with `flag` (`fused`, `flex`), those that have it."""
    names = (DEFAULT_KIND, *sorted(k for k in KINDS if k != DEFAULT_KIND))
    return tuple(k for k in names if not flag or getattr(KINDS[k], flag))
