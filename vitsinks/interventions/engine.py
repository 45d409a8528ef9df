"""The intervention pass (docs/interventions.md): per batch cache the residual stream at every block input, edit one
head at a time with its attention held fixed, run the rest of the network from that block's output, and measure
(the metrics, the rows' columns, the random draws and the whole-model edits: docs/interventions.md, docs/fidelity.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitsinks.diagnostics.core import RECOMPUTE_TOL, layerscale
from vitsinks.diagnostics.fields import head_fields, head_output_weight
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.diagnostics.summary import LOCATIONS, block0_apart, main_blocks, token_location
from vitsinks.interventions.edits import (
    CONTROLS_SEED_OFFSET,
    DONOR_EDITS,
    MITIGATION_EDITS,
    MODEL_EDITS,
    REDIRECT_TOL,
    REF_REDIRECT_CLAMP,
    REGISTER_EDITS,
    SHUFFLE_EDITS,
    VALUE_CHECK_TOL,
    VALUE_EDITS,
    Draws,
    EditCheckFailed,
    apply_value,
    check_redirect,
    check_value_edit,
    derangement,
    random_patch,
    reference_redirect,
    register_control,
    value_edit,
)
from vitsinks.models.kinds import KINDS
from vitsinks.models.mitigations import SINK_VALUE_EDITS, slot_edits
from vitsinks.models.seam import Backbone
from vitsinks.utils.errors import BadValue

Head = tuple[int, int]
COHERENCE_EMPTY = 1e-20  # the reference's: a change of at most this energy (summed over the patches) has no coherence
# `donor_cosine_form` of the summary: the patches the donor direction averages over, by intervene.reference_formulas
DONOR_COSINE_FORMS = {False: "sink patch left out", True: "all patches (the reference's)"}


@dataclass
class Checks:
    """The largest errors of the built-in checks seen so far."""

    recompute_error: float = 0.0
    value_edit_error: float = 0.0
    value_edits_checked: int = 0
    redirect_error: float = 0.0
    redirect_rows_checked: int = 0
    redirect_ref_rows: int = 0  # rows edited by redirect_sink_attention_ref
    redirect_ref_rows_clamped: int = 0  # ... whose new sum fell below the reference's clamp (switched off)
    # edit -> rows not written: a sink (or a donor's sink) on an extra key slot whose value the edit cannot change
    rows_not_applicable: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"recompute_error_max": f"{self.recompute_error:.3e}", "recompute_tol": RECOMPUTE_TOL,
                "value_edit_error_max": f"{self.value_edit_error:.3e}", "value_edit_tol": VALUE_CHECK_TOL,
                "value_edits_checked": self.value_edits_checked,
                "redirect_error_max": f"{self.redirect_error:.3e}", "redirect_tol": REDIRECT_TOL,
                "redirect_rows_checked": self.redirect_rows_checked, "redirect_ref_rows": self.redirect_ref_rows,
                "redirect_ref_rows_clamped": self.redirect_ref_rows_clamped, "redirect_ref_clamp": REF_REDIRECT_CLAMP,
                **({"rows_not_applicable": dict(self.rows_not_applicable)} if self.rows_not_applicable else {})}


@dataclass
class Plan:
    """What to edit and with what: the held-out mean sink values and register tokens, the donor cosine's form."""

    heads: list[Head]
    edits: list[str]
    mean_values: dict[Head, torch.Tensor] = field(default_factory=dict)
    mean_source: dict[Head, str] = field(default_factory=dict)
    mean_skipped: dict[Head, str] = field(default_factory=dict)
    register_means: torch.Tensor | None = None
    register_mean_source: str = ""
    reference_formulas: bool = False

    def blocks(self) -> list[int]:
        return sorted({b for b, _ in self.heads})


class NoSinkHeads(BadValue):
    """No head has enough sink events to be selected."""


def select_heads(d: dict[str, np.ndarray], rules: SinkRules, min_events: int, top_k: int,
                 top_k_block0: int) -> list[Head]:
    """The heads to edit (docs/interventions.md#which-heads); `NoSinkHeads` when none qualifies."""
    cls = rules.event_class(d)  # (images, L, H)
    n_blocks = cls.shape[1]
    chosen: list[Head] = []
    best = {}
    for name in ("nop", "broadcast"):
        counts = (cls == name).sum(axis=0)
        best[name] = int(counts.max())
        groups: list[tuple[Sequence[int], int]] = [(main_blocks(n_blocks, rules.block0_policy), top_k)]
        if block0_apart(n_blocks, rules.block0_policy):
            groups.append(([0], top_k_block0))
        for blocks, k in groups:
            cand = [(int(counts[b, h]), b, h) for b in blocks for h in range(counts.shape[1])
                    if counts[b, h] >= min_events]
            chosen += [(b, h) for _, b, h in sorted(cand, key=lambda t: (-t[0], t[1], t[2]))[:k]]
    if not chosen:
        raise NoSinkHeads(f"no head has >= {min_events} NOP or broadcast sink events among {cls.shape[0]} images "
                         f"(most per head: NOP {best['nop']}, broadcast {best['broadcast']}; rule "
                         f"{rules.rule}): lower intervene.min_events, raise n_images, or name heads=block:head")
    return list(dict.fromkeys(chosen))


def parse_heads(specs: Sequence[str], n_blocks: int, n_heads: int) -> list[Head]:
    """`["3:1", "5:0"]` -> [(3, 1), (5, 0)], each checked against the model."""
    heads = []
    for spec in specs:
        try:
            b, h = (int(x) for x in str(spec).split(":"))
        except ValueError:
            raise BadValue(f"heads entry {spec!r} is not block:head (e.g. heads=[3:1,5:0])") from None
        if not 0 <= b < n_blocks:
            raise BadValue(f"heads entry {spec}: block {b} is out of range (the model has blocks 0..{n_blocks - 1})")
        if not 0 <= h < n_heads:
            raise BadValue(f"heads entry {spec}: head {h} is out of range (block {b} has heads 0..{n_heads - 1})")
        heads.append((b, h))
    return list(dict.fromkeys(heads))


def require_events(d: dict[str, np.ndarray], rules: SinkRules, heads: Sequence[Head]) -> None:
    """Every named head must have at least one sink event among the images."""
    ev = rules.event_class(d) != "none"
    empty = [f"{b}:{h}" for b, h in heads if not ev[:, b, h].any()]
    if empty:
        raise BadValue(f"head(s) {', '.join(empty)} have no sink events on the {ev.shape[0]} images (rule "
                         f"{rules.rule}): there is no sink to edit; pick other heads or omit heads= to select them")


def _fields(blk: Any, it: Any) -> dict[str, torch.Tensor]:
    return head_fields(it.attn, it.v, blk.attn.proj.weight, layerscale(blk), KINDS[blk.attn.attn_kind].signed)


@torch.no_grad()
def mean_sink_values(backbone: Backbone, inputs: torch.Tensor, plan: Plan, rules: SinkRules, batch_size: int) -> None:
    """Fill `plan.mean_values`: per head, the float64 mean held-out sink value (none: `plan.mean_skipped`)."""
    sums: dict[Head, list[Any]] = {hd: [None, 0] for hd in plan.heads}  # event sum, count
    blocks = plan.blocks()
    for lo in range(0, len(inputs), batch_size):
        x = backbone.embed_tokens(inputs[lo : lo + batch_size])
        for b, blk in enumerate(backbone.blocks):
            if b in blocks:
                it = blk.attn.internals(blk.norm1(x), causal=backbone.causal)
                f = _fields(blk, it)
                ev = rules.event_class({k: v.cpu().numpy() for k, v in f.items()}) != "none"
                for bb, h in plan.heads:
                    if bb != b:
                        continue
                    vs = it.v[torch.arange(len(x)), h, f["sink_idx"][:, h]].double()  # (B, hd)
                    acc = sums[(b, h)]
                    # events on a token only: an extra key's value (a null key's 0, a bias) is no token's sink value
                    m = torch.as_tensor(ev[:, h], device=vs.device) & (f["sink_idx"][:, h] < x.shape[1])
                    acc[0] = vs[m].sum(0) + (0 if acc[0] is None else acc[0])
                    acc[1] += int(m.sum())
            if b == blocks[-1]:
                break  # nothing later is needed
            x = backbone.block(b, x)
    for hd, (ev_sum, n_ev) in sums.items():
        if n_ev:
            plan.mean_values[hd] = (ev_sum / n_ev).float()
            plan.mean_source[hd] = f"{n_ev} held-out events"
        else:
            plan.mean_skipped[hd] = f"no sink event on a token among the {len(inputs)} held-out images"


@torch.no_grad()
def mean_register_tokens(backbone: Backbone, inputs: torch.Tensor, plan: Plan, batch_size: int) -> None:
    """Fill `plan.register_means` (L, R, D): the float64 mean register tokens entering every block over `inputs`."""
    if len(inputs) == 0:
        raise BadValue("mean_registers needs held-out images: set intervene.heldout_images > 0")
    c, r, total = backbone.num_cls, backbone.num_registers, None
    for lo in range(0, len(inputs), batch_size):
        x = backbone.embed_tokens(inputs[lo : lo + batch_size])
        sums = []
        for b in range(len(backbone.blocks)):
            sums.append(x[:, c : c + r].double().sum(0))
            if b + 1 < len(backbone.blocks):
                x = backbone.block(b, x)
        batch_sum = torch.stack(sums)
        total = batch_sum if total is None else total + batch_sum
    assert total is not None  # `inputs` is not empty
    plan.register_means = (total / len(inputs)).float()
    plan.register_mean_source = f"{len(inputs)} held-out images"


def _masked_mean(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return (t * keep.unsqueeze(-1)).sum(1) / keep.sum(1, keepdim=True).clamp_min(1)


def patch_metrics(base: torch.Tensor, edited: torch.Tensor, num_prefix: int, sink: torch.Tensor | None,
                  donor: torch.Tensor | None = None, donor_all_patches: bool = False) -> dict[str, torch.Tensor]:
    """Metrics (B,) of a change of the final tokens (B, N, D) over the patches but the sink (docs/interventions.md)."""
    P, Pe = base[:, num_prefix:].double(), edited[:, num_prefix:].double()
    keep = torch.ones(P.shape[:2], dtype=P.dtype, device=P.device)
    if sink is not None:
        idx = sink - num_prefix
        rows = ((idx >= 0) & (idx < P.shape[1])).nonzero().squeeze(-1)  # a sink on a patch (not a prefix or extra key)
        keep[rows, idx[rows]] = 0.0
    d = Pe - P
    n = keep.sum(1).clamp_min(1)
    total = ((d**2).sum(-1) * keep).sum(1)
    energy = total / n
    mean_d = _masked_mean(d, keep)
    base_energy = ((P**2).sum(-1) * keep).sum(1) / n
    out = {"final_patch_relrms": energy.sqrt() / base_energy.sqrt().clamp_min(1e-300),
           "coherence": torch.where((total > COHERENCE_EMPTY) & (keep.sum(1) > 0),
                                    (mean_d**2).sum(-1) / energy.clamp_min(1e-300), torch.nan)}
    if donor is not None:
        mean_p = P.mean(1) if donor_all_patches else _masked_mean(P, keep)
        out["donor_cosine"] = F.cosine_similarity(mean_d, mean_p[donor] - mean_p, dim=-1)
    return out


def probe_metrics(base_logits: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor | None) -> dict[str, Any]:
    """Classifier effects of an edit (B,): agreement, KL(before || after), and with labels CE and correctness."""
    lp0, lp = F.log_softmax(base_logits.double(), -1), F.log_softmax(logits.double(), -1)
    out = {"probe_agree": (logits.argmax(-1) == base_logits.argmax(-1)).double(),
           "probe_kl": (lp0.exp() * (lp0 - lp)).sum(-1)}
    if labels is not None:
        out.update(probe_ce=F.nll_loss(lp, labels, reduction="none"),
                   probe_correct=(logits.argmax(-1) == labels).double(),
                   probe_ce_base=F.nll_loss(lp0, labels, reduction="none"),
                   probe_correct_base=(base_logits.argmax(-1) == labels).double())
    return out


def _rows(first: int, index: np.ndarray, block: int, head: int, edit: str, cls: np.ndarray, sink: np.ndarray,
          loc: np.ndarray, metrics: dict[str, torch.Tensor], donor_index: np.ndarray | None = None,
          random_token: np.ndarray | None = None) -> list[dict[str, Any]]:
    vals = {k: v.detach().cpu().numpy() for k, v in metrics.items()}
    none = np.full(len(cls), -1)
    donor_index = none if donor_index is None else donor_index
    random_token = none if random_token is None else random_token
    return [{"image": first + i, "image_index": int(index[i]), "block": block, "head": head, "edit": edit,
             "donor_index": int(donor_index[i]), "random_token": int(random_token[i]), "event_class": str(cls[i]),
             "sink_idx": int(sink[i]), "sink_loc": str(loc[i]), **{k: float(v[i]) for k, v in vals.items()}}
            for i in range(len(cls))]


def edited_final(backbone: Backbone, b: int, x_in: torch.Tensor, it: Any, heads_out: torch.Tensor, h: int,
                 sink: torch.Tensor, edit: str, donor: torch.Tensor, mean_value: torch.Tensor | None,
                 draws: Draws | None, w_head: torch.Tensor, checks: Checks) -> torch.Tensor:
    """The final tokens after editing head `h` of block `b` with its attention held fixed (the edit checked)."""
    blk = backbone.blocks[b]
    out, gate = heads_out, it.gate
    if edit in VALUE_EDITS:
        ve = value_edit(edit, it.v[:, h], sink, donor, mean_value, draws)
        v_new = apply_value(it.v[:, h], ve)
        err = check_value_edit(it.attn[:, h], it.v[:, h], v_new, ve, w_head)
        checks.value_edit_error = max(checks.value_edit_error, err)
        checks.value_edits_checked += 1
        if not err < VALUE_CHECK_TOL:
            raise EditCheckFailed(f"{edit} on head {b}:{h} changed the head update by {err:.2e} away from its closed "
                                  f"form A_:p (u'_p - u_p) (tolerance {VALUE_CHECK_TOL:.0e})")
        new_head = it.attn[:, h] @ v_new
    elif edit == "redirect_sink_attention":
        red = blk.attn.redirected(blk.norm1(x_in), h, sink, causal=backbone.causal)
        err, n_rows = check_redirect(it.attn[:, h], red, sink, blk.attn)
        checks.redirect_error = max(checks.redirect_error, err)
        checks.redirect_rows_checked += n_rows
        if not err < REDIRECT_TOL:
            raise EditCheckFailed(f"redirect_sink_attention on head {b}:{h}: the attention rebuilt from the scores "
                                  f"differs by {err:.2e} from what A predicts of it where A holds it (tolerance "
                                  f"{REDIRECT_TOL:.0e}): the scores are not the ones A was computed from")
        new_head = red @ it.v[:, h]
    elif edit == "redirect_sink_attention_ref":
        red, clamped = reference_redirect(it.attn[:, h], sink)
        checks.redirect_ref_rows += red.shape[0] * red.shape[1]
        checks.redirect_ref_rows_clamped += clamped
        new_head = red @ it.v[:, h]
    elif edit in MITIGATION_EDITS:  # the mitigation's own edit of the internals (the gate's open / close)
        edited = MITIGATION_EDITS[edit].edit(edit, it, h)
        gate = edited.gate
        same = edited.attn is it.attn and edited.v is it.v
        new_head = None if same else edited.attn[:, h] @ edited.v[:, h]
    else:
        raise ValueError(f"{edit!r} is not a head edit")
    if new_head is not None:
        out = heads_out.clone()
        out[:, h] = new_head
    return backbone.readout(backbone.run(blk.from_heads(x_in, out, gate), b + 1))


@torch.no_grad()
def run_batch(backbone: Backbone, inputs: torch.Tensor, labels: torch.Tensor | None, first: int, index: Sequence[int],
              plan: Plan, rules: SinkRules, gen: torch.Generator, checks: Checks, check_blocks: bool,
              model_edits: bool, controls: torch.Generator | None = None) -> list[dict[str, Any]]:
    """All rows of one batch (positions `first`..., split indices `index`); `check_blocks`: check the rebuilt blocks."""
    B = len(inputs)
    if B < 2:
        raise BadValue("an intervention batch needs at least 2 images (the donor edits take another image's value)")
    if len(index) != B:
        raise ValueError(f"{len(index)} split indices for a batch of {B} images")
    donor = (torch.arange(B, device=inputs.device) + 1) % B
    index_np = np.asarray(index, dtype=np.int64)
    donor_index = index_np[donor.cpu().numpy()]
    if controls is None:
        controls = torch.Generator().manual_seed(CONTROLS_SEED_OFFSET)
    pi = derangement(B, controls)  # drawn first, whichever edits run
    shuffle_index = index_np[pi.numpy()]
    pi = pi.to(inputs.device)
    xs = [backbone.embed_tokens(inputs)]
    for b in range(len(backbone.blocks)):
        xs.append(backbone.block(b, xs[-1]))
    base = backbone.readout(xs[-1])
    if not torch.isfinite(base).all():
        raise BadValue(f"the model's final tokens are not finite on images {first}..{first + B - 1} (NaN or inf "
                         f"weights or inputs): nothing can be measured; check the checkpoint (a run that diverged?)")
    base_logits = backbone.classifier(base) if backbone.classifier else None

    def donor_of(edit: str) -> tuple[torch.Tensor | None, np.ndarray | None]:
        """The edit's donors (B,) in the batch and their split indices (None for an edit without donors)."""
        if edit in DONOR_EDITS:
            return donor, donor_index
        if edit in SHUFFLE_EDITS:
            return pi, shuffle_index
        return None, None

    def measure(before: torch.Tensor, final: torch.Tensor, sink: torch.Tensor | None, edit: str,
                num_prefix: int) -> dict[str, torch.Tensor]:
        if not torch.isfinite(final).all():
            raise EditCheckFailed(f"an edit made the final tokens non-finite on images {first}..{first + B - 1}")
        m = patch_metrics(before, final, num_prefix, sink, donor_of(edit)[0], plan.reference_formulas)
        if base_logits is not None and backbone.classifier is not None:  # one has a classifier when the other is set
            m.update(probe_metrics(base_logits, backbone.classifier(final), labels))
        return m

    rows: list[dict[str, Any]] = []
    model = np.full(B, "model")
    if model_edits and "drop_registers" in plan.edits:
        final = backbone.readout(backbone.run(backbone.without_registers(xs[0])))
        m = measure(backbone.without_registers(base), final, None, "drop_registers", backbone.num_cls)
        rows += _rows(first, index_np, -1, -1, "drop_registers", model, np.full(B, -1), model, m)
    for edit in [e for e in plan.edits if e in REGISTER_EDITS] if model_edits else []:
        for b in range(len(backbone.blocks)):
            mean = None if plan.register_means is None else plan.register_means[b]
            x_edit = register_control(edit, xs[b], backbone.num_registers, mean, pi, backbone.num_cls)
            final = backbone.readout(backbone.run(x_edit, b))
            rows += _rows(first, index_np, b, -1, edit, model, np.full(B, -1), model,
                          measure(base, final, None, edit, backbone.num_prefix), donor_of(edit)[1])
    for b in plan.blocks():
        blk, x_in = backbone.blocks[b], xs[b]
        it = blk.attn.internals(blk.norm1(x_in), causal=backbone.causal)
        heads_out = it.attn @ it.v
        if check_blocks:
            ref = xs[b + 1]
            err = float((blk.from_heads(x_in, heads_out, it.gate) - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
            checks.recompute_error = max(checks.recompute_error, err)
            if not err < RECOMPUTE_TOL:
                raise EditCheckFailed(f"block {b} rebuilt from its attention internals differs from the model's own "
                                      f"forward by {err:.2e} (tolerance {RECOMPUTE_TOL:.0e}): the edits would not act "
                                      f"on the computation the model runs")
        f = _fields(blk, it)
        fn = {k: v.cpu().numpy() for k, v in f.items()}
        classes = rules.event_class(fn)  # (B, H)
        n_tokens = x_in.shape[1]  # the tokens; keys past them are the layout's extra slots
        extra = blk.attn.extra_keys
        on_slot = fn["sink_idx"] >= n_tokens
        slot = np.clip(fn["sink_idx"] - n_tokens, 0, max(len(extra) - 1, 0))
        token_loc = token_location(fn["sink_idx"], backbone.num_registers, backbone.num_cls)
        loc_names = np.where(on_slot, np.array([*extra, ""], dtype=object)[slot],
                             np.array(LOCATIONS, dtype=object)[token_loc])
        w_heads = head_output_weight(blk.attn.proj.weight, blk.attn.num_heads, layerscale(blk))
        for bb, h in plan.heads:  # sorted: the generator is consumed in the order of the sorted heads
            if bb != b:
                continue
            sink = f["sink_idx"][:, h]
            own = random_patch(sink, n_tokens, backbone.num_prefix, gen)
            noise = torch.randn(B, it.v.shape[-1], generator=controls)  # the controls generator, not `gen`
            draws = Draws(own, random_patch(sink[donor], n_tokens, backbone.num_prefix, gen), noise, pi)
            drawn = {"zero_random_nonsink_value": draws.own.cpu().numpy(),
                     "donor_nonsink_value": draws.donor.cpu().numpy()}
            for edit in plan.edits:
                if edit in MODEL_EDITS or (edit == "mean_sink_value" and (b, h) not in plan.mean_values):
                    continue
                final = edited_final(backbone, b, x_in, it, heads_out, h, sink, edit, donor,
                                     plan.mean_values.get((b, h)), draws, w_heads[h], checks)
                new = _rows(first, index_np, b, h, edit, classes[:, h], fn["sink_idx"][:, h], loc_names[:, h],
                            measure(base, final, sink, edit, backbone.num_prefix), donor_of(edit)[1],
                            drawn.get(edit))
                # a sink on an extra key slot only where the edit can change the slot's value (`slot_edits`), and a
                # donor's or shuffled sink value only from a partner whose sink is a token
                partner = {"donor_sink_value": donor, "shuffle_sink_value": pi}.get(edit)
                mate = on_slot[partner.cpu().numpy(), h] if partner is not None else np.zeros(B, dtype=bool)
                keep = [not ((s and edit in SINK_VALUE_EDITS and edit not in slot_edits(extra[i])) or m)
                        for s, i, m in zip(on_slot[:, h], slot[:, h], mate, strict=True)]
                rows += [r for r, k in zip(new, keep, strict=True) if k]
                if not all(keep):
                    checks.rows_not_applicable[edit] = checks.rows_not_applicable.get(edit, 0) + keep.count(False)
    return rows
