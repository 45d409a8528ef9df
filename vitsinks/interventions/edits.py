"""The edits of docs/fidelity.md (and vitsinks' gate / register edits), applied to one head with its attention held
fixed, and the float64 check that a value edit changed exactly what it should.

Value edits replace one value vector per image: `v_p <- new` at position p (`ValueEdit`). The head's update
U = A u (u_j = ls * W_O^h v_j) must then change by exactly `A_:p (u'_p - u_p)`: `check_value_edit` verifies it in
float64 on the tensors the model is actually run with.

`redirect_sink_attention` is computed from the head's scores, not from A (`SinkAttention.redirected`): softmax
heads get the softmax with the sink key masked out, `sink_logit` heads the same with the null key kept, relu and
sigmoid heads their row with column s zeroed and rescaled to its old sum.

The random controls take, per batch and per head, one draw from the run's generator for the image's own random
patch (`zero_random_nonsink_value`) and then one for the donor's (`donor_nonsink_value`), whichever edits run:
a uniform patch, moved to the next patch (cyclically) when it hits the excluded token (`random_patch`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from vitsinks.models.kinds import KINDS
from vitsinks.utils.errors import BadValue, CheckFailed

EDITS = ("zero_sink_value", "mean_sink_value", "donor_sink_value", "donor_nonsink_value", "redirect_sink_attention",
         "zero_random_nonsink_value", "open_gate", "close_gate", "drop_registers")  # the order of every table
VALUE_EDITS = ("zero_sink_value", "mean_sink_value", "donor_sink_value", "donor_nonsink_value",
               "zero_random_nonsink_value")
GATE_EDITS = ("open_gate", "close_gate")
MODEL_EDITS = ("drop_registers",)  # the whole model run without its register tokens (not one head)
DONOR_EDITS = ("donor_sink_value", "donor_nonsink_value")
VALUE_CHECK_TOL = 1e-8  # float64, relative to the head update's largest entry
REDIRECT_TOL = 1e-3  # the redirect from the scores vs A's own rescaling, on rows A holds well (relative, L1)
# ... the rows whose attention off the sink is at least this share of the row: float32 holds their large entries
# to its precision; rows of a kind with a null key also need its share (1 - row sum) without cancellation
REDIRECT_CHECK_SHARE_NULL_KEY = 1e-3
REDIRECT_CHECK_SHARE_DEFAULT = 1e-30


class EditCheckFailed(CheckFailed):
    """A built-in check failed: the edit did not change what it should (an internal error, not bad input)."""


class ValueEdit(NamedTuple):
    """Per image b: replace the value at token `pos[b]` by `new[b]` (hd,)."""

    pos: torch.Tensor
    new: torch.Tensor


class Draws(NamedTuple):
    """One head's random patches in one batch (B,): in each image's own tokens and in its donor's."""

    own: torch.Tensor
    donor: torch.Tensor


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
    """Per image, a patch position (>= num_prefix) other than `exclude[b]`: one uniform draw over the patches from
    `gen` (on the CPU), moved to the next patch (cyclically) when it is `exclude[b]`."""
    n_patch = n_tokens - num_prefix
    if n_patch < 2:
        raise BadValue(f"a random non-sink patch needs at least 2 patch tokens (this model has {n_patch})")
    r = torch.randint(0, n_patch, exclude.shape, generator=gen).to(exclude.device)
    j = num_prefix + r
    return torch.where(j == exclude, num_prefix + (r + 1) % n_patch, j)


def value_edit(name: str, v: torch.Tensor, sink: torch.Tensor, donor: torch.Tensor,
               mean_value: torch.Tensor | None, draws: Draws | None) -> ValueEdit:
    """The `ValueEdit` of `name` for one head's values v (B, N, hd) with sink positions `sink` (B,); image b's
    donor is image `donor[b]` of the batch; `draws` are the random patches drawn for the images (`random_patch`;
    only the random controls read them)."""
    batch = torch.arange(v.shape[0], device=v.device)
    if draws is None and name in ("donor_nonsink_value", "zero_random_nonsink_value"):
        raise ValueError(f"{name} needs the random patches drawn for the batch")
    if name == "zero_sink_value":
        return ValueEdit(sink, torch.zeros_like(v[batch, sink]))
    if name == "mean_sink_value":
        if mean_value is None:
            raise BadValue("mean_sink_value needs the head's mean sink value from held-out images")
        return ValueEdit(sink, mean_value.to(v).expand(v.shape[0], -1))
    if name == "donor_sink_value":
        return ValueEdit(sink, v[donor, sink[donor]])
    if name == "donor_nonsink_value":
        return ValueEdit(sink, v[donor, draws.donor])
    if name == "zero_random_nonsink_value":
        return ValueEdit(draws.own, torch.zeros_like(v[batch, draws.own]))
    raise ValueError(f"{name} is not a value edit")


def apply_value(v: torch.Tensor, edit: ValueEdit) -> torch.Tensor:
    """One head's values (B, N, hd) with `edit` applied (a copy)."""
    out = v.clone()
    out[torch.arange(v.shape[0], device=v.device), edit.pos] = edit.new.to(v.dtype)
    return out


def check_redirect(attn: torch.Tensor, redirected: torch.Tensor, sink: torch.Tensor, kind: str) -> tuple[float, int]:
    """The redirect from the scores against the same edit read off A (B, N, N), on the rows where A itself holds
    enough attention off the sink (`REDIRECT_CHECK_SHARE` of the row) for the rescaling of A to be exact: a guard
    that the scores are the ones A was computed from. Returns (largest relative L1 error, rows checked)."""
    a = attn.double()
    off = a.clone()
    off[torch.arange(len(a), device=a.device), :, sink] = 0.0
    total, rest = a.sum(-1, keepdim=True), off.sum(-1, keepdim=True)
    null_key = KINDS[kind].null_key
    share = REDIRECT_CHECK_SHARE_NULL_KEY if null_key else REDIRECT_CHECK_SHARE_DEFAULT
    keep = (rest.squeeze(-1) >= share * total.squeeze(-1)) & (rest.squeeze(-1) > 0)
    if not keep.any():
        return 0.0, 0
    # a null key (sink_logit's: 1 - the row sum) keeps its share; the other kinds: the row keeps its sum
    expected = off / (rest + (1.0 - total)) if null_key else off / rest * total
    r = redirected.double()[keep]
    err = (r - expected[keep]).abs().sum(-1) / expected[keep].abs().sum(-1).clamp_min(1e-300)
    return float(err.max()), int(keep.sum())


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
