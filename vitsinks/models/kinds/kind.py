"""The attention kind's interface (`AttentionKind`), its registry (`KINDS`) and FlexAttention's (out, lse). A kind
says how a head's scores are formed and become its attention matrix, what that matrix may hold (`normalised`,
`signed`, `sparse`), its fused paths if any, its typed settings (`Settings`, `model.kind_settings`), the parameters it
adds (built knowing the head width and the block's depth, `HeadSpec`), what it does to a head's output before the
output projection (`head_output`), the redirect edit with its float64 twin and the check's prediction from A, and its
formula written out naively (`reference`, for the tests).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
from torch import nn
from torch.nn.attention.flex_attention import AuxOutput, AuxRequest, flex_attention

from vitsinks.utils.errors import BadValue
from vitsinks.utils.registry import Registry

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention

DEFAULT_KIND = "softmax"
REDIRECT_CHECK_SHARE = 1e-30  # the redirect check reads rows whose weight off the sink is at least this share
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


def _typed(kind: str, name: str, value: Any, want: type) -> Any:
    """`value` as a setting of type `want` (a number from text, true/false for a bool; an int only if integral)."""
    try:
        if want is bool and str(value).lower() in ("true", "false"):
            return str(value).lower() == "true"
        if want in (int, float) and not isinstance(value, bool):
            number = float(value)
            if want is float or number.is_integer():
                return want(number)
        elif want not in (bool, int, float):
            return value
    except (TypeError, ValueError):
        pass
    raise BadValue(f"model.kind_settings.{name}={value!r} is not a {want.__name__} (attention kind {kind!r})")


@dataclass(frozen=True)
class NoSettings:
    """The settings of a kind that has none."""


@dataclass(frozen=True)
class HeadSpec:
    """What a kind's parameters are built from: the heads, their width, the block's index (0-based) among `depth`,
    the kind's settings (its `Settings`) and the module's device and dtype."""

    num_heads: int
    head_dim: int
    block: int = 0
    depth: int = 1
    settings: Any = NoSettings()
    device: torch.device | str | None = None
    dtype: torch.dtype | None = None


class AttentionKind:
    """How a head turns scores into attention; methods take the `SinkAttention` (`attn`) for its parameters and
    settings (`attn.kind_settings`, an instance of `Settings`)."""

    name: ClassVar[str]
    normalised: ClassVar[bool] = True  # every row sums to 1 (the null key's share included)
    signed: ClassVar[bool] = False  # weights may be negative (the diagnostics read |A|, docs/sinks.md)
    sparse: ClassVar[bool] = False  # weights may be exactly 0 at finite scores (a head may attend to nothing)
    fused: ClassVar[bool] = False  # has a `scaled_dot_product_attention` path (`fused_heads`)
    flex: ClassVar[bool] = False  # has an exact FlexAttention path (`flex_heads`; CUDA for training)
    null_key: ClassVar[bool] = False  # an always-present key of value 0: the last slot of the key layout
    Settings: ClassVar[type] = NoSettings  # a frozen dataclass of the kind's settings, all with defaults

    @classmethod
    def settings(cls, values: Mapping[str, Any] | None = None) -> Any:
        """The kind's `Settings` from `model.kind_settings` (absent ones: their defaults); an unknown name or a value
        of the wrong type is a `BadValue` naming the kind's settings."""
        values = dict(values or {})
        known = {f.name: f for f in dataclasses.fields(cls.Settings)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            have = ", ".join(f"{n}={f.default!r}" for n, f in known.items()) or "none"
            raise BadValue(f"model.kind_settings: attention kind {cls.name!r} has no setting {unknown[0]!r} (its "
                           f"settings: {have})")
        return cls.Settings(**{name: _typed(cls.name, name, value, type(known[name].default))
                                for name, value in values.items()})

    @classmethod
    def settings_tag(cls, settings: Any) -> str:
        """The settings that differ from their defaults as `(name=value,...)` for the variant name ('' if none)."""
        changed = [f"{f.name}={getattr(settings, f.name)!r}" for f in dataclasses.fields(settings)
                   if getattr(settings, f.name) != f.default]
        return f"({','.join(changed)})" if changed else ""

    @staticmethod
    def problem(settings: Any, n_keys: int) -> str | None:
        """What is wrong with these settings for rows of `n_keys` keys (the model warns with it when it is built),
        or None."""
        return None

    @staticmethod
    def parameters(spec: HeadSpec) -> dict[str, nn.Parameter]:
        """Extra parameters registered on the attention module under these names."""
        return {}

    @staticmethod
    def init_parameters(attn: SinkAttention) -> None:
        """Deterministic init of the extra parameters (called by `SinkAttention.init_weights`)."""

    @staticmethod
    def scores(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The scaled scores (B, heads, ..., N, K') the kind's `matrix` reads, from q (B, heads, N, hd) and k (B,
        heads, K', hd): scale * q k^T (a kind may form several maps per head, on the dims between)."""
        return (q * attn.scale) @ k.transpose(-2, -1)

    @staticmethod
    def matrix(attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        """Attention (B, heads, N, K) from the scores `s` (`scores`); `future` (N, K') marks keys a query may not see
        (causal, or a mask-site mitigation's; None: every key). K = K' + 1 with a `null_key` (its column last), else
        K'."""
        raise NotImplementedError

    @staticmethod
    def head_output(attn: SinkAttention, heads_out: torch.Tensor) -> torch.Tensor:
        """The heads' outputs (B, heads, N, head_dim) as they go on to the output projection (the identity unless the
        kind normalises them, as differential attention does); before any head-output mitigation and the gate."""
        return heads_out

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
        """Head `head`'s attention (B, N, K) from its scores `s` (`scores(...)[:, head]`) with the sink key
        (`is_sink`, (B, N, K)) removed and its share given to the other keys by the kind's own rule; `hidden` (N, K)
        marks keys the queries may not see. A row with no key left is 0."""
        raise NotImplementedError

    @classmethod
    def reference_redirected(cls, attn: SinkAttention, s: torch.Tensor, head: int, n: int,
                             sink: int | None) -> torch.Tensor:
        """`redirected` written out naively on one query's visible scores `s` (as `reference`) in float64, the sink
        at position `sink` of the row `reference` returns (a null key's: last; None: the query does not see it, the
        row unchanged). By default A's row with the sink's weight zeroed and the others rescaled to its old sum."""
        a = cls.reference(attn, s, head, n)
        if sink is None:
            return a
        off = a.clone()
        off[sink] = 0.0
        kept = off.sum()
        return off / kept * a.sum() if kept > 0 else torch.zeros_like(a)

    @staticmethod
    def expected_redirect(attn: SinkAttention, a: torch.Tensor,
                          sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The built-in check's prediction of the redirect from one head's A (B, N, K) alone (and the kind's
        settings, `attn.kind_settings`), in float64, and the rows (B, N) on which it is a prediction: by default the
        sink's column zeroed and each row rescaled to its old sum, on the rows that keep `REDIRECT_CHECK_SHARE` of
        their weight off the sink. A kind whose redirect is no function of A returns no rows."""
        a = a.double()
        off = a.clone()
        off[torch.arange(len(a), device=a.device), :, sink] = 0.0
        total, rest = a.sum(-1, keepdim=True), off.sum(-1, keepdim=True)
        rows = (rest.squeeze(-1) >= REDIRECT_CHECK_SHARE * total.squeeze(-1)) & (rest.squeeze(-1) > 0)
        return off / rest.where(rest > 0, 1.0) * total, rows

    @staticmethod
    def reference(attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        """The kind's formula written out naively on one query's visible scores `s` (K,) of head `head` in a sequence
        of `n` tokens, in float64: the tests' independent truth (a `null_key`'s share last)."""
        raise NotImplementedError


def _check_kind(cls: type[AttentionKind]) -> None:
    """Refuse a kind whose declaration is incomplete or contradicts itself (a `ValueError` naming what is wrong)."""
    own = {name for klass in cls.__mro__ if klass is not AttentionKind for name in vars(klass)}
    needed = ["matrix", "redirected", "reference", *(["fused_heads"] if cls.fused else []),
              *(["flex_heads"] if cls.flex else [])]
    missing = [m for m in needed if m not in own]
    if missing:
        raise ValueError(f"attention kind {getattr(cls, 'name', cls.__name__)!r} declares no {', '.join(missing)}")
    if not (dataclasses.is_dataclass(cls.Settings) and cls.Settings.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise ValueError(f"attention kind {cls.name!r}: `Settings` must be a frozen dataclass")
    if any(f.default is dataclasses.MISSING for f in dataclasses.fields(cls.Settings)):
        raise ValueError(f"attention kind {cls.name!r}: every setting needs a default")
    if cls.signed and cls.normalised:
        raise ValueError(f"attention kind {cls.name!r}: signed weights do not sum to 1 (set normalised = False)")


KINDS: Registry[type[AttentionKind]] = Registry(
    "attention kind", "an `AttentionKind` registered with `@KINDS.register` in a module of "
    "vitsinks/models/kinds/ (docs/extending.md)", check=_check_kind)


def kind_names(flag: str = "") -> tuple[str, ...]:
    """The registered kinds, the default first, then by name; with `flag` (`fused`, `flex`), those that have it."""
    names = (DEFAULT_KIND, *sorted(k for k in KINDS if k != DEFAULT_KIND))
    return tuple(k for k in names if not flag or getattr(KINDS[k], flag))
