"""Sink diagnostics (SPEC section 3): per-head fields, NOP / broadcast classes, spectra, massive activations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from vitsinks.data.views import eval_transform
from vitsinks.diagnostics.core import diagnose, diagnose_tokens, embed, spectrum
from vitsinks.diagnostics.fields import FIELDS, head_fields, qk_spectrum, stable_rank
from vitsinks.diagnostics.summary import classify, events, location, summarize

__all__ = ["FIELDS", "classify", "diagnose", "diagnose_tokens", "embed", "events", "fixed_images", "head_fields",
           "location", "qk_spectrum", "run_diagnostics", "spectrum", "stable_rank", "summarize"]


def fixed_images(dataset: Dataset, n: int, size: int) -> tuple[torch.Tensor, np.ndarray]:
    """The first `n` images of `dataset` as a normalised batch (n, 3, size, size) and as uint8 RGB for plots.

    Datasets of tensors (the sink tasks) are taken as they are, shown min-max scaled per image."""
    first = [dataset[i][0] for i in range(min(n, len(dataset)))]  # type: ignore[arg-type]
    if isinstance(first[0], torch.Tensor):  # tensor datasets (the sink tasks) are model inputs already
        x = torch.stack(first)
        lo, hi = x.amin(dim=(1, 2, 3), keepdim=True), x.amax(dim=(1, 2, 3), keepdim=True)
        show = ((x - lo) / (hi - lo).clamp_min(1e-12) * 255).round().byte().permute(0, 2, 3, 1).numpy()
        return x, show
    tf = eval_transform(size)
    x = torch.stack([tf(im) for im in first])
    show = np.stack([np.asarray(im.convert("RGB").resize((size, size))) for im in first])
    return x, show


def run_diagnostics(model: torch.nn.Module, images: torch.Tensor, shown: np.ndarray, out_dir: Path,
                    settings: Any = None) -> dict[str, Any]:
    """Diagnose `model` on `images`; write `per_image.npz`, `summary.json` and the PNG plots into `out_dir`.

    `settings` is a `DiagnosticsConfig` (rule, eps, ratio, use_stable_rank, plots); None means its defaults.
    """
    from vitsinks.config import DiagnosticsConfig
    from vitsinks.diagnostics.plots import all_plots

    st = settings or DiagnosticsConfig()
    out_dir.mkdir(parents=True, exist_ok=True)
    d = diagnose(model, images)
    summary = summarize(d, rule=st.rule, eps=st.eps, ratio=st.ratio, use_rank=st.use_stable_rank)
    np.savez_compressed(out_dir / "per_image.npz", **{k: v for k, v in d.items() if k != "attn_col_mean"})
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if st.plots:
        all_plots(d, summary, shown, out_dir, st.ratio)
    return summary
