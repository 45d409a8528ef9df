"""The edits of docs/interventions.md (exact definitions, random draws and register controls: docs/fidelity.md),
applied to one head with its attention held fixed, and the float64 check that a value edit changed exactly what it
should (`check_value_edit`: the head update must change by `A_:p (u'_p - u_p)`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

import torch

from vitsinks.models.attention import SinkAttention
from vitsinks.models.kinds import KINDS
from vitsinks.models.mitigations import MITIGATIONS, brought_edits
from vitsinks.utils.errors import BadValue, CheckFailed

# the mitigations' own edits (`BlockMitigation.edits`: the gate's open_gate / close_gate) -> their mitigation
MITIGATION_EDITS = brought_edits()
EDITS = ("zero_sink_value", "mean_sink_value", "noise_sink_value", "donor_sink_value", "shuffle_sink_value",
         "donor_nonsink_value", "redirect_sink_attention", "redirect_sink_attention_ref", "zero_random_nonsink_value",
         *MITIGATION_EDITS, "drop_registers", "zero_registers", "mean_registers",
         "shuffle_registers")  # the order of every table
REFERENCE_EDITS = ("redirect_sink_attention_ref",)  # by default only with intervene.reference_formulas
VALUE_EDITS = ("zero_sink_value", "mean_sink_value", "noise_sink_value", "donor_sink_value", "shuffle_sink_value",
               "donor_nonsink_value", "zero_random_nonsink_value")
REGISTER_EDITS = ("zero_registers", "mean_registers", "shuffle_registers")  # at the input of every block in turn
MODEL_EDITS = ("drop_registers", *REGISTER_EDITS)
DONOR_EDITS = ("donor_sink_value", "donor_nonsink_value")  # the donor is the next image of the batch
SHUFFLE_EDITS = ("shuffle_sink_value", "shuffle_registers")  # the donor is pi(b), the batch's seeded derangement
CONTROLS_SEED_OFFSET = 500  # the controls generator: seed + 1000 * shard + 500, never a patch generator's seed
VALUE_CHECK_TOL = 1e-8  # float64, relative to the head update's largest entry
REDIRECT_TOL = 1e-3  # the redirect from the scores vs A's own rescaling, on rows A holds well (relative, L1)
REF_REDIRECT_CLAMP = 1e-12  # the reference's clamp of the new row sum (vit_causal/interventions.py)


class EditCheckFailed(CheckFailed):
    """A built-in check failed: the edit did not change what it should (an internal error, not bad input)."""


class ValueEdit(NamedTuple):
    """Per image b: replace the value at token `pos[b]` by `new[b]` (hd,)."""

    pos: torch.Tensor
    new: torch.Tensor


class Draws(NamedTuple):
    """One head's random draws in one batch: own and donor patches (B,), normal vectors (B, hd), derangement (B,)."""

    own: torch.Tensor
    donor: torch.Tensor
    noise: torch.Tensor | None = None
    shuffle: torch.Tensor | None = None


def resolve_edits(requested: list[str], mitigations: Collection[str], registers: int,
                  kinds: Collection[str] = ("softmax",), reference: bool = False) -> list[str]:
    """The `requested` edits checked against the model, or every edit that applies to it when none is asked."""
    unknown = [e for e in requested if e not in EDITS]
    if unknown:
        raise BadValue(f"unknown edit(s) {', '.join(unknown)}: choose from {', '.join(EDITS)}")
    # the reference's redirect renormalises every row to 1: only for rows that sum to 1 without a null key (softmax);
    # not for a sparse kind either, whose own redirect may select keys that A gives exactly 0 (rescaling keeps them 0)
    other = sorted(k for k in set(kinds) if not (KINDS[k].normalised and not KINDS[k].null_key and not KINDS[k].sparse))
    refused = {e: name for name in mitigations if name in MITIGATIONS for e in MITIGATIONS[name].refused_edits}
    for e in requested:
        if e in refused:
            raise BadValue(f"edit {e} does not apply to a model with the {refused[e]} mitigation (model."
                           f"{refused[e]}); choose other edits: intervene.edits=[...] without {e}")
        if e in MITIGATION_EDITS and MITIGATION_EDITS[e].name not in mitigations:
            m = MITIGATION_EDITS[e]
            raise BadValue(f"edit {e} needs a model with the {m.name} mitigation (e.g. model.{m.name}={m.example}); "
                           f"this one has none")
        if e in MODEL_EDITS and not registers:
            raise BadValue(f"edit {e} needs a model with register tokens (model.registers > 0); this one has none")
        if e in REFERENCE_EDITS and other:
            raise BadValue(f"edit {e} is the reference's formula for softmax attention (rows renormalised to 1); this "
                           f"model's attention is {', '.join(other)}: use redirect_sink_attention")
    if requested:
        return list(dict.fromkeys(requested))
    return [e for e in EDITS if (e not in MITIGATION_EDITS or MITIGATION_EDITS[e].name in mitigations)
            and e not in refused
            and (e not in MODEL_EDITS or registers)
            and (e not in REFERENCE_EDITS or (reference and not other))]


def random_patch(exclude: torch.Tensor, n_tokens: int, num_prefix: int, gen: torch.Generator) -> torch.Tensor:
    """Per image, a uniform patch (>= num_prefix) from `gen`, moved to the next one when it is `exclude[b]`."""
    n_patch = n_tokens - num_prefix
    if n_patch < 2:
        raise BadValue(f"a random non-sink patch needs at least 2 patch tokens (this model has {n_patch})")
    r = torch.randint(0, n_patch, exclude.shape, generator=gen).to(exclude.device)
    j = num_prefix + r
    return torch.where(j == exclude, num_prefix + (r + 1) % n_patch, j)


def derangement(n: int, gen: torch.Generator) -> torch.Tensor:
    """A uniform derangement of 0..n-1 (n >= 2): `torch.randperm(n)` from `gen`, redrawn until no fixed point."""
    if n < 2:
        raise BadValue(f"a derangement needs at least 2 images (got {n})")
    while True:
        pi = torch.randperm(n, generator=gen)
        if not (pi == torch.arange(n)).any():
            return pi


def noise_value(v_sink: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Per image, the normal draw z[b] rescaled (in float64) to ||v_sink[b]||, in v_sink's dtype."""
    zd, vd = z.double(), v_sink.double()
    return (zd * (vd.norm(dim=-1, keepdim=True) / zd.norm(dim=-1, keepdim=True))).to(v_sink.dtype)


def register_control(name: str, x: torch.Tensor, registers: int, mean: torch.Tensor | None = None,
                     perm: torch.Tensor | None = None, num_cls: int = 1) -> torch.Tensor:
    """`x` (B, N, D) with its register tokens zeroed, set to `mean` (R, D) or to image perm[b]'s (a copy)."""
    reg = slice(num_cls, num_cls + registers)
    out = x.clone()
    if name == "zero_registers":
        out[:, reg] = 0.0
    elif name == "mean_registers":
        if mean is None:
            raise ValueError("mean_registers needs the held-out mean register tokens")
        out[:, reg] = mean.to(x)
    elif name == "shuffle_registers":
        if perm is None:
            raise ValueError("shuffle_registers needs the batch's derangement")
        out[:, reg] = x[perm.to(x.device), reg]
    else:
        raise ValueError(f"{name} is not a register control")
    return out


def value_edit(name: str, v: torch.Tensor, sink: torch.Tensor, donor: torch.Tensor,
               mean_value: torch.Tensor | None, draws: Draws | None) -> ValueEdit:
    """The `ValueEdit` of `name` for one head's values v (B, N, hd) with sinks `sink` (B,) and donors `donor`."""
    batch = torch.arange(v.shape[0], device=v.device)
    if draws is None and name in ("donor_nonsink_value", "zero_random_nonsink_value"):
        raise ValueError(f"{name} needs the random patches drawn for the batch")
    if name == "noise_sink_value":
        if draws is None or draws.noise is None:
            raise ValueError("noise_sink_value needs the normal vectors drawn for the batch")
        return ValueEdit(sink, noise_value(v[batch, sink], draws.noise.to(v.device)))
    if name == "shuffle_sink_value":
        if draws is None or draws.shuffle is None:
            raise ValueError("shuffle_sink_value needs the batch's derangement")
        pi = draws.shuffle.to(v.device)
        return ValueEdit(sink, v[pi, sink[pi]])
    if name == "zero_sink_value":
        return ValueEdit(sink, torch.zeros_like(v[batch, sink]))
    if name == "mean_sink_value":
        if mean_value is None:
            raise BadValue("mean_sink_value needs the head's mean sink value from held-out images")
        return ValueEdit(sink, mean_value.to(v).expand(v.shape[0], -1))
    if name == "donor_sink_value":
        return ValueEdit(sink, v[donor, sink[donor]])
    if name == "donor_nonsink_value":
        assert draws is not None  # refused above
        return ValueEdit(sink, v[donor, draws.donor])
    if name == "zero_random_nonsink_value":
        assert draws is not None  # refused above
        return ValueEdit(draws.own, torch.zeros_like(v[batch, draws.own]))
    raise ValueError(f"{name} is not a value edit")


def apply_value(v: torch.Tensor, edit: ValueEdit) -> torch.Tensor:
    """One head's values (B, N, hd) with `edit` applied (a copy)."""
    out = v.clone()
    out[torch.arange(v.shape[0], device=v.device), edit.pos] = edit.new.to(v.dtype)
    return out


def check_redirect(attn: torch.Tensor, redirected: torch.Tensor, sink: torch.Tensor,
                   module: SinkAttention) -> tuple[float, int]:
    """(largest relative L1 error, rows checked) of the redirect from the scores against the prediction from A of
    the `module`'s kind (`AttentionKind.expected_redirect`; by default A rescaled, on the rows A holds off the sink):
    a guard that the scores are the ones A came from."""
    expected, keep = KINDS[module.attn_kind].expected_redirect(module, attn, sink)
    if not keep.any():
        return 0.0, 0
    r = redirected.double()[keep]
    err = (r - expected[keep]).abs().sum(-1) / expected[keep].abs().sum(-1).clamp_min(1e-300)
    return float(err.max()), int(keep.sum())


def reference_redirect(attn: torch.Tensor, sink: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The reference's redirect of one head's A (B, N, N): in float32, column sink[b] zeroed and each row divided by
    its new sum clamped at `REF_REDIRECT_CLAMP`; returns (the new A, the rows whose sum fell below the clamp)."""
    a = attn.float().clone()
    a[torch.arange(len(a), device=a.device), :, sink] = 0.0
    total = a.sum(-1, keepdim=True)
    return (a / total.clamp_min(REF_REDIRECT_CLAMP)).to(attn.dtype), int((total < REF_REDIRECT_CLAMP).sum())


def check_value_edit(attn: torch.Tensor, v: torch.Tensor, v_new: torch.Tensor, edit: ValueEdit,
                     w_head: torch.Tensor) -> float:
    """Relative float64 error of the head update's change against its closed form `A_:p (u'_p - u_p)`: attn (B, N,
    N), v / v_new (B, N, hd) one head's values before / after, `w_head` (dim, hd) = diag(ls) W_O^h."""
    a, w = attn.double(), w_head.double()
    batch = torch.arange(a.shape[0], device=a.device)
    before = (a @ v.double()) @ w.T
    change = (a @ v_new.double()) @ w.T - before
    du = (edit.new.double() - v.double()[batch, edit.pos]) @ w.T  # u'_p - u_p, (B, dim)
    closed = a[batch, :, edit.pos].unsqueeze(-1) * du.unsqueeze(1)  # A_ip (u'_p - u_p), (B, N, dim)
    scale = torch.maximum(before.abs().amax(), closed.abs().amax()).clamp_min(1e-300)
    return float((change - closed).abs().amax() / scale)
