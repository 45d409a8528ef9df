"""Causal interventions on sink heads (docs/interventions.md): `intervene(backbone, images, ...)` runs a model (its
`Backbone`) through stage 1 (the diagnostics fields, or a reused copy, to pick heads), the held-out mean sink values
and the edits over batches; shard k of n edits `sorted(selected)[k::n]` (the whole-model edits in shard 0), with
its generators seeded `intervene.seed + 1000 * k` (random patches) and `... + 500` (vitsinks' controls).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from vitsinks.diagnostics.core import diagnose_inputs
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.interventions.edits import CONTROLS_SEED_OFFSET, MODEL_EDITS, resolve_edits
from vitsinks.interventions.engine import (
    DONOR_COSINE_FORMS,
    Checks,
    NoSinkHeads,
    Plan,
    mean_register_tokens,
    mean_sink_values,
    parse_heads,
    require_events,
    run_batch,
    select_heads,
)
from vitsinks.models.seam import Backbone
from vitsinks.utils.errors import BadValue
from vitsinks.utils.progress import hidden

log = logging.getLogger(__name__)

@dataclass
class Result:
    """Rows (one per image, head, edit) and what produced them."""

    rows: list[dict[str, Any]]
    heads: list[tuple[int, int]]  # the heads this shard edited
    selected: list[tuple[int, int]]  # every selected head, before sharding
    edits: list[str]
    checks: Checks
    n_blocks: int
    n_images: int
    mean_source: dict[str, str] = field(default_factory=dict)
    mean_skipped: dict[str, str] = field(default_factory=dict)  # head -> why it has no mean_sink_value rows
    register_mean_source: str = ""  # what mean_registers averaged ("" when it did not run)
    donor_cosine_form: str = DONOR_COSINE_FORMS[False]  # the patches the donor direction averages over


def stage_one(backbone: Backbone, images: torch.Tensor, batch_size: int) -> dict[str, np.ndarray]:
    """The per-(image, block, head) diagnostics fields of `images` (what head selection reads)."""
    return diagnose_inputs(backbone.blocks, backbone.embed_tokens, images, batch_size, causal=backbone.causal,
                           num_prefix=backbone.num_prefix)


def batches(n: int, size: int) -> list[tuple[int, int]]:
    """Consecutive [lo, hi) ranges of `size` images; a trailing single image joins the batch before it."""
    if n < 2:
        raise BadValue(f"interventions need at least 2 images (got {n}): raise n_images")
    size = max(size, 2)
    out = [(lo, min(n, lo + size)) for lo in range(0, n, size)]
    if len(out) > 1 and out[-1][1] - out[-1][0] == 1:
        out[-2:] = [(out[-2][0], n)]
    return out


def intervene(backbone: Backbone, images: torch.Tensor, labels: torch.Tensor | None, heldout: torch.Tensor,
              settings: Any, rules: SinkRules | None = None, stage1: dict[str, np.ndarray] | None = None,
              progress: bool = True, index: Sequence[int] | None = None,
              heldout_index: Sequence[int] | None = None) -> Result:
    """Select heads (or check `settings.heads`, an `InterveneConfig`'s), then run every edit on every selected head
    of this shard. `stage1`: diagnostics fields of `images` computed before, checked against the live sinks (stale:
    an error). `index` / `heldout_index`: the images' split indices (default: their positions), disjoint. The model is
    left in evaluation mode.
    """
    index = list(range(len(images))) if index is None else [int(i) for i in index]
    heldout_index = (list(range(len(images), len(images) + len(heldout))) if heldout_index is None
                     else [int(i) for i in heldout_index])
    if len(index) != len(images) or len(heldout_index) != len(heldout):
        raise BadValue(f"{len(index)} / {len(heldout_index)} split indices for {len(images)} edited / "
                       f"{len(heldout)} held-out images")
    overlap = sorted(set(index) & set(heldout_index))
    if overlap:
        raise BadValue(f"{len(overlap)} held-out images are also edited (split index {overlap[0]}, ...): the mean "
                       f"sink value must come from other images; take the held-out images after the edited ones")
    rules = rules or SinkRules()
    backbone.eval()  # the explicit recomputations and the edits read the model without dropout
    n_blocks = len(backbone.blocks)
    ranges = batches(len(images), settings.batch_size)
    reference = bool(getattr(settings, "reference_formulas", False))
    edits = resolve_edits(list(settings.edits), backbone.mitigations, backbone.num_registers, backbone.attn_kinds,
                          reference)
    d = stage1 if stage1 is not None else stage_one(backbone, images, settings.batch_size)
    if list(settings.heads):
        selected = parse_heads(settings.heads, n_blocks, backbone.heads(0))
        require_events(d, rules, selected)
    else:
        try:
            selected = select_heads(d, rules, settings.min_events, settings.top_k, settings.top_k_block0)
        except NoSinkHeads as err:
            if not any(e in MODEL_EDITS for e in edits):
                raise
            log.warning("%s; running the whole-model edits (%s) only", err,
                        ", ".join(e for e in edits if e in MODEL_EDITS))
            selected = []
    if not 0 <= settings.shard < settings.nshards:
        raise BadValue(f"shard={settings.shard} is not in 0..nshards-1 (nshards={settings.nshards})")
    selected = sorted(selected)
    heads = selected[settings.shard :: settings.nshards]
    plan = Plan(heads, edits, reference_formulas=reference)
    if heads and "mean_sink_value" in edits:
        if len(heldout) == 0:
            raise BadValue("mean_sink_value needs held-out images: set intervene.heldout_images > 0")
        mean_sink_values(backbone, heldout, plan, rules, settings.batch_size)
        if plan.mean_skipped:
            log.warning("mean_sink_value skipped for head(s) %s: no sink event among the %d held-out images",
                        ", ".join(f"{b}:{h}" for b, h in plan.mean_skipped), len(heldout))
        if not plan.mean_values and "mean_sink_value" in settings.edits:
            raise BadValue(f"mean_sink_value was asked for, but no head of this shard ("
                           f"{', '.join(f'{b}:{h}' for b, h in heads)}) has a sink event among the {len(heldout)} "
                           f"held-out images: raise intervene.heldout_images or drop the edit")
    model_edits = settings.shard == 0 and any(e in MODEL_EDITS for e in edits)
    if model_edits and "mean_registers" in edits:
        mean_register_tokens(backbone, heldout, plan, settings.batch_size)
    seed = int(settings.seed) + 1000 * int(settings.shard)
    gen = torch.Generator().manual_seed(seed)
    controls = torch.Generator().manual_seed(seed + CONTROLS_SEED_OFFSET)  # gen's draws do not depend on these
    checks, rows = Checks(), []
    bar = tqdm(total=len(ranges) * (len(heads) + model_edits), desc="interventions (heads x batches)",
               unit="head", disable=hidden(not progress))
    for i, (lo, hi) in enumerate(ranges):
        rows += run_batch(backbone, images[lo:hi], None if labels is None else labels[lo:hi], lo, index[lo:hi], plan,
                          rules, gen, checks, check_blocks=i == 0, model_edits=model_edits, controls=controls)
        bar.update(len(heads) + model_edits)
    bar.close()
    if stage1 is not None:
        _check_fresh(d, rows)
    return Result(rows, heads, selected, edits, checks, n_blocks, len(images),
                  {f"{b}:{h}": s for (b, h), s in plan.mean_source.items()},
                  {f"{b}:{h}": s for (b, h), s in plan.mean_skipped.items()}, plan.register_mean_source,
                  DONOR_COSINE_FORMS[reference])


def _check_fresh(d: dict[str, np.ndarray], rows: list[dict[str, Any]]) -> None:
    """Refuse reused diagnostics that put the sink of a live event elsewhere (stale diagnostics)."""
    bad = [r for r in rows if r["block"] >= 0 and r["head"] >= 0 and r["event_class"] != "none"
           and int(d["sink_idx"][r["image"], r["block"], r["head"]]) != r["sink_idx"]]
    if bad:
        r = bad[0]
        raise BadValue(f"the reused diagnostics do not match this checkpoint (image {r['image']}, head "
                         f"{r['block']}:{r['head']}: sink at {r['sink_idx']} now, "
                         f"{int(d['sink_idx'][r['image'], r['block'], r['head']])} in the diagnostics): they are "
                         f"stale; rerun python -m vitsinks.diagnose on the checkpoint or delete its diagnostics")
