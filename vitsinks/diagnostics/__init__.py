"""Sink diagnostics (docs/fidelity.md): per-head fields, NOP / broadcast classes, spectra, massive activations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import transforms as T

from vitsinks.configs.schema import DiagnosticsConfig, ProtocolConfig
from vitsinks.data.selection import analysis_transform, select_items
from vitsinks.diagnostics.core import Diagnosable, diagnose, diagnose_tokens, spectrum
from vitsinks.diagnostics.fields import FIELDS, head_fields, qk_spectrum, stable_rank
from vitsinks.diagnostics.neurons import NeuronCollector, neuron_k, summarize_neurons
from vitsinks.diagnostics.page import REPORT, REPORT_JSON, checkpoint_report
from vitsinks.diagnostics.plots import all_plots
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.diagnostics.sinktable import write_sink_table
from vitsinks.diagnostics.summary import DiagnosticsSummary, classify, events, location, summarize
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.generations import Kind, claim, generation
from vitsinks.utils.rundir import LOCK, PER_IMAGE, SOURCE, SUMMARY

__all__ = ["DIAGNOSIS", "FIELDS", "DiagnosticsSummary", "SinkRules", "classify", "diagnose", "diagnose_tokens",
           "events", "fixed_images", "head_fields", "images_of", "location", "protocol_transform", "qk_spectrum",
           "run_diagnostics", "spectrum", "stable_rank", "stretched", "summarize"]


# A diagnosis's folder holds one generation of its files (`utils.generations`); `legacy`: the names the versions
# before the record wrote there (a fixed list), `keep`: the diagnosis's lock and the record of a model's folder
DIAGNOSIS = Kind("diagnosis", marks=(PER_IMAGE,), keep=(SOURCE, LOCK), last=SUMMARY, legacy=(
    PER_IMAGE, SUMMARY, "sink_table.md", "sink_table.csv", REPORT, REPORT_JSON, "attention_maps.png",
    "nop_broadcast_scatter.png", "sink_heatmap.png", "sink_location_by_block.png", "massive_activations.png",
    "residual_norms.png", "high_norm_tokens.png"))


def stretched(images: torch.Tensor) -> np.ndarray:
    """Model inputs (n, 3, H, W) as uint8 RGB (n, H, W, 3) for plots and pages, each image min-max stretched to its
    own range (for inputs whose normalisation is not known here)."""
    x = images.detach().float().cpu()
    lo, hi = x.amin(dim=(1, 2, 3), keepdim=True), x.amax(dim=(1, 2, 3), keepdim=True)
    return ((x - lo) / (hi - lo).clamp_min(1e-12) * 255).round().byte().permute(0, 2, 3, 1).numpy()


def images_of(items: list[tuple], size: int, protocol: Any = None) -> tuple[torch.Tensor, np.ndarray]:
    """Dataset items' images as a normalised batch (n, 3, size, size), preprocessed as `protocol` says
    (`analysis_transform`), and as uint8 RGB for plots.

    Datasets of tensors (the sink tasks) are taken as they are, shown min-max scaled per image."""
    first = [item[0] for item in items]
    if isinstance(first[0], torch.Tensor):  # tensor datasets (the sink tasks) are model inputs already
        x = torch.stack(first)
        return x, stretched(x)
    crop, *rest = protocol_transform(size, protocol).transforms  # crop once: the model's view is what plots show
    cropped = [crop(im.convert("RGB")) for im in first]
    x = torch.stack([T.Compose(rest)(im) for im in cropped])
    show = np.stack([np.asarray(im) for im in cropped])
    return x, show


def protocol_transform(size: int, protocol: Any = None) -> Any:
    """`analysis_transform` with the preprocessing of `protocol` (a `ProtocolConfig`; None: the defaults)."""
    p = protocol or ProtocolConfig()
    return analysis_transform(size, p.crop_pct, str(p.interpolation))


def fixed_images(dataset: Dataset, n: int, size: int, on_bad_image: str = "skip",
                 protocol: Any = None) -> tuple[torch.Tensor, np.ndarray, list[int]]:
    """The first `n` readable images of `dataset` in the order of `protocol` (a seeded permutation by default,
    see `vitsinks.data.selection`; all of them when it holds fewer), see `images_of`, and their indices in the
    split."""
    p = protocol or ProtocolConfig()
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise BadValue("the validation split is empty: there is no image to diagnose")
    ((items, idx),) = select_items(dataset, [n], p, on_bad_image, up_to=True)
    x, shown = images_of(items, size, p)
    return x, shown, idx


def run_diagnostics(model: Diagnosable, images: torch.Tensor, shown: np.ndarray, out_dir: Path,
                    settings: Any = None, image_index: list[int] | None = None, protocol: Any = None,
                    quant: dict[str, Any] | None = None, trainfree: dict[str, Any] | None = None,
                    batch_size: int = 16) -> dict[str, Any]:
    """Diagnose `model` (a `SinkViT`, or a pretrained model's view: `core.Diagnosable`) on `images`, `batch_size` at
    a time; write `per_image.npz`, `summary.json`, the sink table in the reference's
    layout (`sink_table.md`, `sink_table.csv`, block 0 counted with `block0`) and the PNG plots into `out_dir`.

    `settings` is a `DiagnosticsConfig` (rule, eps, ratio, use_stable_rank, plots); None means its defaults.
    `image_index` (each image's index in its split) and `protocol` (its name) are recorded in the outputs. With
    `settings.residual` the summary has the residual side (docs/residual.md) with the register neurons; with
    `settings.report` the visual report page (`report.html`, docs/report.md) is written too, with the panels of a
    quantization result (`quant`, results/quant.json) and of a training-free edit (`trainfree`, its settings).
    The outputs are one generation (`DIAGNOSIS`, `utils.generations`): every file an older diagnosis wrote in
    `out_dir` is replaced or removed, and nothing else there; `summary.json` comes last (a folder without it holds
    an interrupted diagnosis). A non-empty folder without an earlier diagnosis is refused before any work, and so is
    a second diagnosis of the same folder at the same time (`BadValue`).
    """
    st = settings or DiagnosticsConfig()
    claim(out_dir, DIAGNOSIS)  # before the lock file: a folder of the user's gets nothing, not even a lock
    with files.FileLock(out_dir / LOCK, f"the diagnosis in {out_dir}", DIAGNOSING), \
            generation(out_dir, DIAGNOSIS) as stage:  # nothing left of an older one, nothing of anyone else's touched
        return _diagnose_into(model, images, shown, stage, st, image_index, protocol, quant, trainfree, out_dir.name,
                              batch_size)


DIAGNOSING = "wait for it to finish: another command diagnoses this checkpoint into the same folder"


def _diagnose_into(model: Diagnosable, images: torch.Tensor, shown: np.ndarray, out_dir: Path, st: Any,
                   image_index: list[int] | None, protocol: Any, quant: dict[str, Any] | None,
                   trainfree: dict[str, Any] | None, name: str, batch_size: int = 16) -> dict[str, Any]:
    """The diagnosis written into `out_dir` (the staging folder of `name`'s generation)."""
    neurons = NeuronCollector(model.blocks, neuron_k(st.high_norm_k), model.num_prefix_tokens) if st.residual else None
    d = diagnose(model, images, batch_size, keep_maps=max(4, st.report_images if st.report else 0), neurons=neurons)
    if image_index is not None:
        d["image_index"] = np.asarray(image_index, dtype=np.int64)
    rules = SinkRules.from_config(st)
    result = DiagnosticsSummary.from_json(summarize(d, rules, residual=st.residual,
                                                    high_norm_k=list(st.high_norm_k)))
    if st.residual and result.residual is not None:
        result.residual["register_neurons"] = summarize_neurons(model, None, st, neurons.got)
    result.protocol = str((protocol or ProtocolConfig()).name)
    summary = result.to_json()
    with files.atomic_open(out_dir / PER_IMAGE, "wb") as f:
        np.savez_compressed(f, **{k: v for k, v in d.items() if k != "attn_col_mean"})
    result.write(out_dir / SUMMARY)
    write_sink_table(d, out_dir, block0=bool(getattr(st, "block0", False)), protocol=result.protocol,
                     block0_policy=rules.block0_policy)
    if st.plots:
        all_plots(d, summary, shown, out_dir, st.ratio)
    if st.report:
        checkpoint_report(model, images, shown, d, summary, out_dir, st.report_images, quant=quant, trainfree=trainfree,
                          name=name)
    return summary
