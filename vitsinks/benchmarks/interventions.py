"""`python -m vitsinks.bench intervene`: the cost of one edit relative to one forward pass from the edited block on."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vitsinks.backbones import sinkvit_backbone
from vitsinks.benchmarks.timing import interleaved, ratio_stats, table
from vitsinks.diagnostics.core import layerscale
from vitsinks.diagnostics.fields import head_output_weight
from vitsinks.interventions.engine import Checks, edited_final
from vitsinks.models import SIZES, build_vit

EDITS = ("zero_sink_value", "redirect_sink_attention")


def run(size: str = "vit_cpu", batch: int = 8, repeats: int = 15) -> str:
    """Return the ratios of one head's edit in the middle block to the forward from that block on."""
    torch.manual_seed(0)
    spec = SIZES[size]
    model = build_vit(size)
    subject = sinkvit_backbone(model.eval())
    b = len(subject.blocks) // 2
    with torch.no_grad():
        x = subject.embed(torch.randn(batch, 3, spec.img_size, spec.img_size))
        for i in range(b):
            x = subject.block(i, x)
        blk = subject.blocks[b]
        it = blk.attn.internals(blk.norm1(x), causal=False)
        heads_out = it.attn @ it.v
        sink = it.attn[:, 0].mean(-2).argmax(-1)
        w = head_output_weight(blk.attn.proj.weight, blk.attn.num_heads, layerscale(blk))[0]
        donor = (torch.arange(batch) + 1) % batch

        def edited(e: str) -> Callable[[], object]:  # these edits draw nothing
            return lambda: edited_final(subject, b, x, it, heads_out, 0, sink, e, donor, None, None, w, Checks())

        fns: dict[str, Callable[[], object]] = {"forward": lambda: subject.readout(subject.run(x, b))}
        fns.update({edit: edited(edit) for edit in EDITS})
        times = interleaved(fns, repeats=repeats, warmup=2)
    rows = []
    for edit in EDITS:
        med, lo, hi = ratio_stats(times[edit], times["forward"])
        rows.append([f"one edit ({edit}) / forward from block {b} on", f"{med:.2f}", f"{lo:.2f}-{hi:.2f}", "<= 1.2"])
    return (f"interventions on {size}, batch {batch}, block {b} of {len(subject.blocks)}, head 0, {repeats} "
            f"interleaved rounds (the block input and attention internals are cached once per batch and block)\n\n"
            + table(rows, ["measure", "ratio", "IQR", "target"]))
