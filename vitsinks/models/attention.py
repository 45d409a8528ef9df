"""One attention module for every attention kind and heads- / keys-site mitigation (`SinkAttention`, with timm's
parameter names, so a timm `VisionTransformer` state dict loads unchanged).

`internals(x)` is the single explicit computation (A, v, gate): the diagnostics read exactly what the model runs. The
forward (`heads`) runs a fused kernel where the kind has one (`kernel`, chosen by `model.fused_attention`):
FlexAttention (exact, on CUDA), SDPA or the explicit path; `internals` and `redirected` never do.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from functools import partialmethod
from typing import Any, NamedTuple

import torch
from timm.layers import use_fused_attn
from torch import nn

from vitsinks.models.kinds import ATTN_KINDS, DEFAULT_KIND, KINDS, AttentionKind, HeadSpec
from vitsinks.models.layout import NULL_SLOT
from vitsinks.models.mitigations import at_site
from vitsinks.models.mitigations.gate import G1Gate
from vitsinks.models.rope import PatchRope
from vitsinks.utils.errors import BadValue

HEAD_MITIGATIONS = at_site("heads")
KEY_MITIGATIONS = at_site("keys")
OUTPUT_MITIGATIONS = at_site("outputs")
MASK_MITIGATIONS = at_site("mask")
ATTENTION_SITES = (*HEAD_MITIGATIONS, *KEY_MITIGATIONS, *OUTPUT_MITIGATIONS, *MASK_MITIGATIONS)
# model.fused_attention: auto = FlexAttention on CUDA, else SDPA, else explicit; flex = FlexAttention on any device
# (CPU: inference only); sdpa = SDPA where the kind has it; off = always explicit
FUSED_MODES: tuple[str, ...] = ("auto", "flex", "sdpa", "off")
FLEX_MIN_HEAD_DIM = 16  # conservative: Triton's smallest dot tile; smaller heads take SDPA or the explicit path


def select_kernel(kind: type[AttentionKind], mode: str, device: str, *, causal: bool, dropout: bool, sdpa: bool,
                  head_dim: int) -> str:
    """The kernel of a forward (flex | sdpa | explicit) for `kind` under `mode` (`FUSED_MODES`) on a `device` type:
    causal and `off` explicit; FlexAttention (no dropout, head_dim >= FLEX_MIN_HEAD_DIM) where the kind has it under
    `flex`, or `auto` on CUDA; else SDPA where the kind has it and `sdpa` (timm's `use_fused_attn`); else explicit."""
    if mode not in FUSED_MODES:
        raise BadValue(f"unknown fused attention mode {mode!r}; choose one of {FUSED_MODES}")
    if causal or mode == "off":
        return "explicit"
    if (kind.flex and not dropout and head_dim >= FLEX_MIN_HEAD_DIM
            and (mode == "flex" or (mode == "auto" and device == "cuda"))):
        return "flex"
    return "sdpa" if kind.fused and sdpa else "explicit"


def merge_heads(heads_out: torch.Tensor, gate: torch.Tensor | None, norm: nn.Module) -> torch.Tensor:
    """(B, heads, N, head_dim) -> (B, N, heads * head_dim): the heads merged, through the scale `norm`, gated."""
    B, H, N, D = heads_out.shape
    y = norm(heads_out.transpose(1, 2).reshape(B, N, H * D))
    return y if gate is None else (y.view(B, N, H, D) * gate).view(B, N, H * D)


class AttnInternals(NamedTuple):
    """Explicit internals of one attention call on a pre-normed input of N tokens: `attn` (B, heads, N, K) over the K
    keys of the key layout (the tokens, then `SinkAttention.extra_keys`), `v` (B, heads, K, head_dim) (a null key's
    is 0), `gate` broadcastable to (B, N, heads, head_dim) (None without a gate)."""

    attn: torch.Tensor
    v: torch.Tensor
    gate: torch.Tensor | None


class SinkAttention(nn.Module):
    """Multi-head self-attention of a registered kind (`attn`, with its `kind_settings`) with mitigations by config
    name (`gate=...`); `block` and `depth` place it in its model (a kind's parameters may depend on them; `place`)."""

    gate: G1Gate | None  # the G1 gate, set with the other mitigations' modules
    rope: PatchRope | None  # the model's RoPE of the patch tokens, shared by its blocks (`SinkViT` sets it)

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_norm: bool = False,
                 scale_norm: bool = False, proj_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 norm_layer: type[nn.Module] | None = None, attn: str = DEFAULT_KIND,
                 kind_settings: Mapping[str, Any] | None = None, block: int = 0, depth: int = 1,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 **mitigations: Any) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if dim % num_heads:
            raise BadValue(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        if attn not in KINDS:
            raise BadValue(f"unknown attention kind {attn!r}; choose one of {ATTN_KINDS}")
        unknown = set(mitigations) - {m.name for m in ATTENTION_SITES}
        if unknown:
            raise TypeError(f"SinkAttention got unknown arguments {sorted(unknown)}")
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("qk_norm / scale_norm need a norm_layer")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.kind = KINDS[attn]
        self.attn_kind = str(attn)
        self.kind_settings = self.kind.settings(kind_settings)
        self.block, self.depth = int(block), int(depth)
        self.fused_attn = use_fused_attn()
        self.fused_mode = "auto"  # one of FUSED_MODES (`set_fused_attention`)

        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm and norm_layer else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm and norm_layer else nn.Identity()
        self.rope = None
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim, **dd) if scale_norm and norm_layer else nn.Identity()
        for m in ATTENTION_SITES:
            setting = m.setting(mitigations.get(m.name))
            module = None if setting is None else m.build(setting, dim, num_heads)
            if module is not None and (device is not None or dtype is not None):
                module.to(device=device, dtype=dtype)
            setattr(self, m.attr, module)
        self.kind_parameter_names: tuple[str, ...] = ()  # the kind's own parameters' names
        self._build_kind_parameters(device, dtype)
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.init_weights()

    def _build_kind_parameters(self, device: torch.device | str | None = None,
                               dtype: torch.dtype | None = None) -> None:
        spec = HeadSpec(self.num_heads, self.head_dim, self.block, self.depth, self.kind_settings, device, dtype)
        params = self.kind.parameters(spec)
        self.kind_parameter_names = tuple(params)
        for name, param in params.items():
            self.register_parameter(name, param)

    def place(self, block: int, depth: int) -> None:
        """Tell the module it is block `block` of `depth` (0-based; a `SinkViT` does for each of its blocks): the
        kind's parameters are built again for that place and initialised."""
        if (block, depth) == (self.block, self.depth) or not self.kind_parameter_names:
            self.block, self.depth = int(block), int(depth)
            return
        like = getattr(self, self.kind_parameter_names[0])
        self.block, self.depth = int(block), int(depth)
        self._build_kind_parameters(like.device, like.dtype)
        self.kind.init_parameters(self)

    @property
    def gate_kind(self) -> str:
        """The G1 gate's mode: none | elementwise | headwise."""
        return "none" if self.gate is None else self.gate.mode

    @property
    def extra_keys(self) -> tuple[str, ...]:
        """The extra key slots after the tokens: the keys-site mitigations', then the kind's null key."""
        slots = tuple(name for m in KEY_MITIGATIONS if getattr(self, m.attr) is not None for name in m.slots)
        return (*slots, NULL_SLOT) if self.kind.null_key else slots

    def init_weights(self) -> None:
        """Reference init of the mitigations' modules and the kind's parameters (timm's ViT init calls it last)."""
        for m in ATTENTION_SITES:
            module = getattr(self, m.attr)
            if module is not None:
                module.init_weights()
        self.kind.init_parameters(self)

    def kernel(self, device: torch.device | str | None = None, is_causal: bool = False) -> str:
        """The kernel `heads` runs on `device` (default: the module's): flex | sdpa | explicit (`select_kernel`)."""
        device = torch.device(self.qkv.weight.device if device is None else device)
        masked = any(getattr(self, m.attr) is not None for m in MASK_MITIGATIONS)  # explicit, like causal
        return select_kernel(self.kind, self.fused_mode, device.type, causal=is_causal or masked,
                             dropout=self.training and self.attn_drop.p > 0, sdpa=self.fused_attn,
                             head_dim=self.head_dim)

    @property
    def uses_fused(self) -> bool:
        """Whether the (bidirectional) forward runs a fused kernel, FlexAttention or SDPA, on the module's device."""
        return self.kernel() != "explicit"

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, heads, N, hd); k, v (B, heads, N + E, hd) with the keys-site mitigations' E extra keys (after the key
        norm and the RoPE of the patches: they are parameters)."""
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q, k)
        for m in KEY_MITIGATIONS:
            module = getattr(self, m.attr)
            if module is not None:
                k_extra, v_extra = module.keys(B)
                k, v = torch.cat([k, k_extra.to(k.dtype)], dim=2), torch.cat([v, v_extra.to(v.dtype)], dim=2)
        return q, k, v

    def key_values(self, v: torch.Tensor) -> torch.Tensor:
        """v with the kind's null key's zero value appended (the values of every key of the layout)."""
        return torch.cat([v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1])], dim=-2) if self.kind.null_key else v

    @staticmethod
    def _future(n: int, k: int, device: torch.device) -> torch.Tensor:
        """(n, k): the future tokens of a causal query (extra keys are never in the future)."""
        return torch.ones(n, k, dtype=torch.bool, device=device).triu_(1).logical_and_(
            torch.arange(k, device=device) < n)

    def hidden(self, n: int, k: int, device: torch.device, causal: bool = False) -> torch.Tensor | None:
        """(n, k): the keys each of the n queries may not see (causal future, mask-site mitigations'), or None."""
        out = self._future(n, k, device) if causal else None
        for m in MASK_MITIGATIONS:
            module = getattr(self, m.attr)
            if module is not None:
                mask = module.hidden(n, k, device)
                out = mask if out is None else out | mask
        return out

    def head_output(self, heads_out: torch.Tensor) -> torch.Tensor:
        """The heads' outputs (B, heads, N, head_dim) as the output projection reads them before the gate: the kind's
        `head_output`, then the outputs-site mitigations'."""
        heads_out = self.kind.head_output(self, heads_out)
        for m in OUTPUT_MITIGATIONS:
            module = getattr(self, m.attr)
            if module is not None:
                heads_out = module(heads_out)
        return heads_out

    def _gate(self, x: torch.Tensor) -> torch.Tensor | None:
        gate = None
        for m in HEAD_MITIGATIONS:
            module = getattr(self, m.attr)
            if module is not None:
                values = module.values(x)
                gate = values if gate is None else gate * values
        return gate

    def _attention_matrix(self, q: torch.Tensor, k: torch.Tensor, causal: bool = False) -> torch.Tensor:
        s = self.kind.scores(self, q, k)
        return self.kind.matrix(self, s, self.hidden(q.shape[-2], k.shape[-2], s.device, causal))

    def internals(self, x: torch.Tensor, causal: bool = False) -> AttnInternals:
        """Explicit attention matrix, values and gate for a pre-normed input `x` (B, N, dim); `causal` masks future
        keys (the synthetic sequence tasks)."""
        q, k, v = self._qkv(x)
        return AttnInternals(self._attention_matrix(q, k, causal), self.key_values(v), self._gate(x))

    def redirected(self, x: torch.Tensor, head: int, sink: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """Head `head`'s attention (B, N, K) on the pre-normed input `x` with image b's attention to key `sink[b]`
        given to the other keys (`AttentionKind.redirected`), computed from the scores: A's entries off a strong sink
        underflow to exactly 0 in float32. A row with no key left is 0."""
        q, k, _ = self._qkv(x)
        s = self.kind.scores(self, q, k)[:, head]  # (B, [maps,] N, N + E), as in `_attention_matrix`
        B, n = s.shape[0], s.shape[-2]
        keys = s.shape[-1] + int(self.kind.null_key)  # every key of the layout
        is_sink = torch.zeros(B, n, keys, dtype=torch.bool, device=s.device)
        is_sink[torch.arange(B, device=s.device), :, sink] = True
        hidden = self.hidden(n, keys, s.device, causal)
        if hidden is None:
            hidden = torch.zeros(n, keys, dtype=torch.bool, device=s.device)
        return self.kind.redirected(self, s, head, is_sink, hidden)

    def combine(self, heads_out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """(B, heads, N, head_dim) per-head outputs -> (B, N, dim): the head output (`head_output`), scale-norm,
        gate, output projection."""
        return self.proj_drop(self.proj(merge_heads(self.head_output(heads_out), gate, self.norm)))

    def heads(self, x: torch.Tensor, is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-head outputs (B, heads, N, head_dim), fused where possible, and the gate (see `AttnInternals`)."""
        kernel = self.kernel(x.device, is_causal)
        if kernel == "explicit":
            attn, v, gate = self.internals(x, causal=is_causal)
            return self.attn_drop(attn) @ v, gate  # a null key's zero value: its column adds nothing
        q, k, v = self._qkv(x)
        if kernel == "sdpa":
            return self.kind.fused_heads(self, q, k, v, self.attn_drop.p if self.training else 0.0), self._gate(x)
        return self.kind.flex_heads(self, q, k, v), self._gate(x)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None:
            raise NotImplementedError("SinkAttention takes no attention mask (is_causal is supported)")
        return self.combine(*self.heads(x, is_causal))


def set_fused_attention(model: nn.Module, mode: str) -> None:
    """Set the fused-attention mode (`FUSED_MODES`) of every `SinkAttention` in `model`."""
    if mode not in FUSED_MODES:
        raise BadValue(f"model.fused_attention={mode!r} is not a mode; choose one of {FUSED_MODES}")
    for m in model.modules():
        if isinstance(m, SinkAttention):
            m.fused_mode = str(mode)


@functools.cache
def attention_layer(attn: str = DEFAULT_KIND, **fixed: Any) -> type[SinkAttention]:
    """`SinkAttention` with its kind, mitigations and placement fixed (`fixed`: hashable keyword arguments; the kind
    settings as a tuple of (name, value) pairs), as timm's `Block(attn_layer=...)` takes it: a subclass (timm calls
    `issubclass` on it), cached, so equal arguments give the same class."""
    label = "_".join([attn, *(f"{k}-{v}" for k, v in sorted(fixed.items()))])
    if "kind_settings" in fixed:
        fixed = {**fixed, "kind_settings": dict(fixed["kind_settings"])}
    return type(f"SinkAttention[{label}]", (SinkAttention,),
                {"__init__": partialmethod(SinkAttention.__init__, attn=attn, **fixed),
                 "__module__": __name__, "__doc__": SinkAttention.__doc__})
