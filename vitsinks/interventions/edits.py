"""The edits of SPEC section 6 (and vitsinks' gate / register edits), applied to one head with its attention held
fixed, and the float64 check that a value edit changed exactly what it should.

Value edits replace one value vector per image: `v_p <- new` at position p (`ValueEdit`). The head's update
U = A u (u_j = ls * W_O^h v_j) must then change by exactly `A_:p (u'_p - u_p)`: `check_value_edit` verifies it in
float64 on the tensors the model is actually run with.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from vitsinks.errors import BadValue, CheckFailed

EDITS = ("zero_sink_value", "mean_sink_value", "donor_sink_value", "donor_nonsink_value", "redirect_sink_attention",
         "zero_random_nonsink_value", "open_gate", "close_gate", "drop_registers")  # the order of every table
VALUE_EDITS = ("zero_sink_value", "mean_sink_value", "donor_sink_value", "donor_nonsink_value",
               "zero_random_nonsink_value")
GATE_EDITS = ("open_gate", "close_gate")
MODEL_EDITS = ("drop_registers",)  # the whole model run without its register tokens (not one head)
DONOR_EDITS = ("donor_sink_value", "donor_nonsink_value")
VALUE_CHECK_TOL = 1e-8  # float64, relative to the head update's largest entry
RECOMPUTE_TOL = 1e-4  # the block rebuilt from (A, v, gate) vs the model's own forward, relative


class EditCheckFailed(CheckFailed):
    """A built-in check failed: the edit did not change what it should (an internal error, not bad input)."""


class ValueEdit(NamedTuple):
    """Per image b: replace the value at token `pos[b]` by `new[b]` (hd,)."""

    pos: torch.Tensor
    new: torch.Tensor


def resolve_edits(requested: list[str], gated: bool, registers: int) -> list[str]:
    """The edits to run: `requested` checked against the model, or every edit that applies when it is empty."""
    unknown = [e for e in requested if e not in EDITS]
    if unknown:
        raise BadValue(f"unknown edit(s) {', '.join(unknown)}: choose from {', '.join(EDITS)}")
    for e in requested:
        if e in GATE_EDITS and not gated:
            raise BadValue(f"edit {e} needs a gated model (model.gate=elementwise or headwise); this one has no gate")
        if e in MODEL_EDITS and not registers:
            raise BadValue(f"edit {e} needs a model with register tokens (model.registers > 0); this one has none")
    if requested:
        return list(dict.fromkeys(requested))
    return [e for e in EDITS if (e not in GATE_EDITS or gated) and (e not in MODEL_EDITS or registers)]


def random_patch(exclude: torch.Tensor, n_tokens: int, num_prefix: int, gen: torch.Generator) -> torch.Tensor:
    """Per image, a uniformly drawn patch position (>= num_prefix) other than `exclude[b]`."""
    n_patch = n_tokens - num_prefix
    excl_is_patch = (exclude >= num_prefix).long()
    r = (torch.rand(len(exclude), generator=gen) * (n_patch - excl_is_patch).cpu()).long().to(exclude.device)
    j = num_prefix + r
    return j + ((excl_is_patch == 1) & (j >= exclude)).long()


def value_edit(name: str, v: torch.Tensor, sink: torch.Tensor, donor: torch.Tensor, num_prefix: int,
               mean_value: torch.Tensor | None, gen: torch.Generator) -> ValueEdit:
    """The `ValueEdit` of `name` for one head's values v (B, N, hd) with sink positions `sink` (B,); image b's
    donor is image `donor[b]` of the batch."""
    batch = torch.arange(v.shape[0], device=v.device)
    if name == "zero_sink_value":
        return ValueEdit(sink, torch.zeros_like(v[batch, sink]))
    if name == "mean_sink_value":
        if mean_value is None:
            raise BadValue("mean_sink_value needs the head's mean sink value from held-out images")
        return ValueEdit(sink, mean_value.to(v).expand(v.shape[0], -1))
    if name == "donor_sink_value":
        return ValueEdit(sink, v[donor, sink[donor]])
    if name == "donor_nonsink_value":
        other = random_patch(sink[donor], v.shape[1], num_prefix, gen)
        return ValueEdit(sink, v[donor, other])
    if name == "zero_random_nonsink_value":
        pos = random_patch(sink, v.shape[1], num_prefix, gen)
        return ValueEdit(pos, torch.zeros_like(v[batch, pos]))
    raise ValueError(f"{name} is not a value edit")


def apply_value(v: torch.Tensor, edit: ValueEdit) -> torch.Tensor:
    """One head's values (B, N, hd) with `edit` applied (a copy)."""
    out = v.clone()
    out[torch.arange(v.shape[0], device=v.device), edit.pos] = edit.new.to(v.dtype)
    return out


def redirect(attn: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """One head's attention (B, N, N) with the sink column set to 0 and every row rescaled to its old sum (1 for
    softmax; a row that attended only to the sink stays 0)."""
    out = attn.clone()
    out[torch.arange(attn.shape[0], device=attn.device), :, sink] = 0.0
    total, rest = attn.sum(-1, keepdim=True), out.sum(-1, keepdim=True)
    return torch.where(rest > 0, out * (total / rest.clamp_min(1e-30)), out)


def check_value_edit(attn: torch.Tensor, v: torch.Tensor, v_new: torch.Tensor, edit: ValueEdit,
                     w_head: torch.Tensor) -> float:
    """Relative float64 error of the head update's change against its closed form `A_:p (u'_p - u_p)`.

    attn (B, N, N), v / v_new (B, N, hd) one head's values before / after, `w_head` (dim, hd) = diag(ls) W_O^h.
    """
    a, w = attn.double(), w_head.double()
    batch = torch.arange(a.shape[0], device=a.device)
    before = (a @ v.double()) @ w.T
    change = (a @ v_new.double()) @ w.T - before
    du = (edit.new.double() - v.double()[batch, edit.pos]) @ w.T  # u'_p - u_p, (B, dim)
    closed = a[batch, :, edit.pos].unsqueeze(-1) * du.unsqueeze(1)  # A_ip (u'_p - u_p), (B, N, dim)
    scale = torch.maximum(before.abs().amax(), closed.abs().amax()).clamp_min(1e-300)
    return float((change - closed).abs().amax() / scale)
