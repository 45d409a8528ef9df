"""A diagnosis with a known answer: a tiny model whose block 1 head 2 sends every query to one patch, diagnosed; the
residual-stream and W8A8 parts of a summary written by hand; a run's page over training built from them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tests.helpers.tiny import tiny_vit
from vitsinks.diagnostics import diagnose, summarize
from vitsinks.diagnostics.page import REPORT
from vitsinks.diagnostics.run_page import run_report
from vitsinks.models import SinkViT
from vitsinks.utils.rundir import RunDir

BLOCK, HEAD, PATCH = 1, 2, 6  # the planted sink: block 1's head 2 sends every query to patch 6 (grid cell (1, 2))


def plant_patch_sink(model: SinkViT, block: int, head: int, patch: int) -> None:
    """Every query of (block, head) attends to one patch token: that patch's position embedding gets a large value
    in channel 0, which the head's keys read, and the head's query is a constant."""
    dim = model.embed_dim
    hd = dim // model.blocks[block].attn.num_heads
    qkv = model.blocks[block].attn.qkv
    with torch.no_grad():
        model.pos_embed[0, 1 + patch, 0] += 40.0  # pos_embed: [CLS] then the patches (registers have none)
        qkv.weight[head * hd:(head + 1) * hd] = 0.0
        qkv.bias[head * hd:(head + 1) * hd] = 0.0
        qkv.bias[head * hd] = 1.0  # q = e_0
        qkv.weight[dim + head * hd:dim + (head + 1) * hd] = 0.0
        qkv.bias[dim + head * hd:dim + (head + 1) * hd] = 0.0
        qkv.weight[dim + head * hd, 0] = 60.0  # k_0 = 60 x the normed channel 0


def diagnosed(registers: int = 0, depth: int = 4, n: int = 3) -> tuple[SinkViT, torch.Tensor, np.ndarray, dict,
                                                                       dict]:
    """A tiny model (`depth` blocks, `registers`) with the sink of BLOCK, HEAD planted at PATCH, `n` seeded images, the
    images shown, their diagnosis (maps kept) and its summary."""
    torch.manual_seed(0)
    model = tiny_vit(depth=depth, registers=registers).eval()
    plant_patch_sink(model, BLOCK, HEAD, PATCH)
    images = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    shown = np.random.default_rng(2).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    d = diagnose(model, images, keep_maps=n)
    return model, images, shown, d, summarize(d)


RESIDUAL = {"norm_quantiles_by_block": {"q50": [1.5, 2.5, 3.5, 4.5], "q90": [2.25, 3.25, 4.25, 5.25],
                                        "q99": [7.125, 8.125, 9.125, 10.5], "max": [40.5, 55.5, 66.5, 77.5]},
            "norm_hist": {"edges": [0.11, 1.1, 11.1], "counts_by_block": [[3, 4]] * 4},
            "high_norm": {"5.0": {"per_image_by_block": [0.0, 1.0, 1.25, 2.0],
                                  "location_by_block": {"cls": [0.0, 0.5, 0.25, 1.0], "register": [0.0] * 4,
                                                        "patch": [0.0, 0.5, 1.0, 1.0]},
                                  "sink_share_by_block": [None, 0.625, 0.875, 0.9375]}},
            "top_activations": {"top_by_block": [[31.5, 12.5, 11.5], [41.5, 13.5, 12.75], [51.5, 14.5, 13.75],
                                                 [61.5, 15.5, 14.75]],
                                "median_by_block": [0.3125, 0.4375, 0.5625, 0.6875],
                                "ratio_by_block": [100.8, 94.86, 91.56, 89.45], "channel_by_block": [7, 7, 19, 19],
                                "location_by_block": ["patch", "cls", "cls", "register"]}}

QUANT = {"checkpoint": "last.pt", "weight_bits": 8, "act_bits": 8, "calib_images": 32, "n_images": 64,
         "by_block": {"kurtosis": {k: [3.125, 4.25, 5.375, 6.5] for k in ("qkv", "proj", "fc1", "fc2")},
                      "inf_norm": {k: [9.5, 10.5, 11.5, 12.5] for k in ("qkv", "proj", "fc1", "fc2")}},
         "feature_cosine": 0.9875, "feature_cosine_by_block": [0.999, 0.998, 0.9925, 0.9875],
         "online_top1": {"fp32": 51.25, "quant": 50.75, "delta": -0.5}, "linear_top1": None,
         "dense": {"dense_synthetic": {"fp32": 30.5, "quant": 29.25, "delta": -1.25}}}


def over_training_page(tmp_path: Path, report: tuple) -> RunDir:
    """A run with the diagnostics of two steps (step 200's with the residual side and a page of its own) and its
    page over training."""
    run = RunDir(tmp_path / "run")
    _, _, (_, _, _, _, summary) = report
    for step, scale in ((100, 0.0), (200, 1.0)):
        spi = {c: {loc: scale * (i + 1) for loc in ("cls", "register", "patch", "all")}
               for i, c in enumerate(("nop", "broadcast", "unclassified", "all"))}
        s = {**{k: v for k, v in summary.items() if k != "residual"}, "sinks_per_image": spi}
        if step == 200:
            s["residual"] = RESIDUAL
            (run.step_diagnostics(step) / REPORT).parent.mkdir(parents=True)
            (run.step_diagnostics(step) / REPORT).write_text("<html></html>")
        run.step_diagnostics(step).mkdir(parents=True, exist_ok=True)
        (run.step_diagnostics(step) / "summary.json").write_text(json.dumps(s))
    run_report(run)
    return run
