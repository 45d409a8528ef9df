"""Sink diagnostics (SPEC section 3): per-head fields, NOP / broadcast classes, spectra, massive activations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from vitsinks import files
from vitsinks.data.views import eval_transform
from vitsinks.diagnostics.core import diagnose, diagnose_tokens, embed, spectrum
from vitsinks.diagnostics.fields import FIELDS, head_fields, qk_spectrum, stable_rank
from vitsinks.diagnostics.summary import classify, events, location, summarize
from vitsinks.errors import BadValue

__all__ = ["FIELDS", "classify", "dataset_items", "diagnose", "diagnose_tokens", "embed", "events", "fixed_images",
           "head_fields", "images_of", "location", "qk_spectrum", "run_diagnostics", "spectrum", "stable_rank",
           "summarize"]


def dataset_items(dataset: Dataset, start: int, n: int) -> list[tuple]:
    """Items `start` .. `start + n - 1` of `dataset`; asking for more than it holds is an error."""
    if start + n > len(dataset):  # type: ignore[arg-type]
        raise BadValue(f"the validation split has {len(dataset)} items; items {start}..{start + n - 1} were "  # type: ignore[arg-type]
                         f"asked for: lower the number of images or use a larger split")
    return [dataset[i] for i in range(start, start + n)]


def images_of(items: list[tuple], size: int) -> tuple[torch.Tensor, np.ndarray]:
    """Dataset items' images as a normalised batch (n, 3, size, size) and as uint8 RGB for plots.

    Datasets of tensors (the sink tasks) are taken as they are, shown min-max scaled per image."""
    first = [item[0] for item in items]
    if isinstance(first[0], torch.Tensor):  # tensor datasets (the sink tasks) are model inputs already
        x = torch.stack(first)
        lo, hi = x.amin(dim=(1, 2, 3), keepdim=True), x.amax(dim=(1, 2, 3), keepdim=True)
        show = ((x - lo) / (hi - lo).clamp_min(1e-12) * 255).round().byte().permute(0, 2, 3, 1).numpy()
        return x, show
    tf = eval_transform(size)
    x = torch.stack([tf(im) for im in first])
    show = np.stack([np.asarray(im.convert("RGB").resize((size, size))) for im in first])
    return x, show


def fixed_images(dataset: Dataset, n: int, size: int, on_bad_image: str = "skip") -> tuple[torch.Tensor, np.ndarray]:
    """The first `n` readable images of `dataset` (all of them when it holds fewer; unreadable ones skipped under
    `on_bad_image=skip`), see `images_of`."""
    from vitsinks.data import read_item

    items = []
    for i in range(len(dataset)):  # type: ignore[arg-type]
        if len(items) == n:
            break
        if (item := read_item(dataset, i, on_bad_image)) is not None:
            items.append(item)
    if not items:
        raise BadValue(f"no readable image in the first {n} items of the validation split")
    return images_of(items, size)


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
    with files.atomic_open(out_dir / "per_image.npz", "wb") as f:
        np.savez_compressed(f, **{k: v for k, v in d.items() if k != "attn_col_mean"})
    files.write_json(out_dir / "summary.json", summary)
    if st.plots:
        all_plots(d, summary, shown, out_dir, st.ratio)
    return summary
