"""The register neurons through the views (`diagnostics.neurons`, docs/residual.md, whose `capture` and summary read
a `Foreign` as a `SinkViT`: the views give `mlp_parts`): the diagnosis's per-block summary as a table (`neuron_table`,
`diagnose(..., neurons=True)`'s `neurons`).

Functions here take a `Foreign` (no `api.as_foreign`: `api` imports this module)."""

from __future__ import annotations

import numpy as np
import torch

from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics.neurons import capture, neuron_k, summarize_neurons
from vitsinks.pretrained.views import Foreign

DEFAULTS = DiagnosticsConfig()
NEURON_K = neuron_k(DEFAULTS.high_norm_k)  # the summary's threshold (5 x the median norm)
NEURON_COLUMNS = ("block", "unit", "rank", "score", "norm_share")


@torch.no_grad()
def neuron_table(foreign: Foreign, images: torch.Tensor, k: float = NEURON_K, top: int = DEFAULTS.register_neurons,
                 batch_size: int = 16) -> dict[str, np.ndarray]:
    """`diagnostics.neurons.summarize_neurons` through the views as a table: one row per (block, unit) of each
    block's `top` units, highest score first: `block`, `unit`, `rank` (0 first), `score` and the block's
    `norm_share`. Blocks without a plain MLP or without outlier patches (norm > `k` x the median) have no row."""
    got = capture(foreign, images, k, batch_size)
    settings = DiagnosticsConfig(high_norm_k=[k], register_neurons=top)
    by_block = summarize_neurons(foreign, None, settings, got)["by_block"]
    rows = [(b, u, r, s, np.nan if e["norm_share"] is None else e["norm_share"])
            for b, e in enumerate(by_block) for r, (u, s) in enumerate(zip(e["units"], e["scores"], strict=True))]
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(NEURON_COLUMNS)
    return {name: np.asarray(col, dtype=float if name in ("score", "norm_share") else int)
            for name, col in zip(NEURON_COLUMNS, cols, strict=True)}
