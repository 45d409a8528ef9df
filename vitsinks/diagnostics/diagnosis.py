"""A diagnosis written into a folder (`run_diagnostics`): `per_image.npz`, `summary.json`, the sink table, the
plots and the report page, one generation of the folder's files (`DIAGNOSIS`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitsinks.backbones import adapt
from vitsinks.configs.schema import DiagnosticsConfig, SelectionConfig
from vitsinks.diagnostics.core import diagnose
from vitsinks.diagnostics.neurons import NeuronCollector, neuron_k, summarize_neurons
from vitsinks.diagnostics.page import REPORT, REPORT_JSON, checkpoint_report
from vitsinks.diagnostics.plots import all_plots
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.diagnostics.sinktable import write_sink_table
from vitsinks.diagnostics.summary import DiagnosticsSummary, summarize
from vitsinks.models.seam import Backbone
from vitsinks.utils import files
from vitsinks.utils.generations import Kind, claim, generation
from vitsinks.utils.rundir import LOCK, PER_IMAGE, SOURCE, SUMMARY

# One generation of a diagnosis's files (`utils.generations`); `legacy`: the names written before the record
DIAGNOSIS = Kind("diagnosis", marks=(PER_IMAGE,), keep=(SOURCE, LOCK), last=SUMMARY, legacy=(
    PER_IMAGE, SUMMARY, "sink_table.md", "sink_table.csv", REPORT, REPORT_JSON, "attention_maps.png",
    "nop_broadcast_scatter.png", "sink_heatmap.png", "sink_location_by_block.png", "massive_activations.png",
    "residual_norms.png", "high_norm_tokens.png"))


def run_diagnostics(model: Backbone | nn.Module, images: torch.Tensor, shown: np.ndarray, out_dir: Path,
                    settings: DiagnosticsConfig | None = None, image_index: list[int] | None = None,
                    selection: SelectionConfig | None = None,
                    quant: dict[str, Any] | None = None, trainfree: dict[str, Any] | None = None,
                    batch_size: int = 16) -> dict[str, Any]:
    """Diagnose `model` (its `Backbone`, or a model of an adapted family) on `images`, `batch_size` at a time, and
    write `per_image.npz`, `summary.json`, the sink table (`sink_table.md` / `.csv`), the PNG plots and, with
    `settings.report`, the report page (with the `quant` and `trainfree` panels) into `out_dir` (docs/commands.md).

    `settings`: a `DiagnosticsConfig` (None: its defaults); `image_index` and `selection` are recorded. The outputs
    are one generation (`DIAGNOSIS`, `utils.generations`), `summary.json` last; a non-empty folder without an earlier
    diagnosis, and a second diagnosis of the same folder at the same time, are refused before any work (`BadValue`).
    """
    st = settings or DiagnosticsConfig()
    claim(out_dir, DIAGNOSIS)  # before the lock file: a folder of the user's gets nothing, not even a lock
    with files.FileLock(out_dir / LOCK, f"the diagnosis in {out_dir}", DIAGNOSING), \
            generation(out_dir, DIAGNOSIS) as stage:  # nothing left of an older one, nothing of anyone else's touched
        return _diagnose_into(adapt(model), images, shown, stage, st, image_index, selection, quant, trainfree,
                              out_dir.name, batch_size)


DIAGNOSING = "wait for it to finish: another command diagnoses this checkpoint into the same folder"


def _diagnose_into(model: Backbone, images: torch.Tensor, shown: np.ndarray, out_dir: Path, st: DiagnosticsConfig,
                   image_index: list[int] | None, selection: SelectionConfig | None, quant: dict[str, Any] | None,
                   trainfree: dict[str, Any] | None, name: str, batch_size: int = 16) -> dict[str, Any]:
    """The diagnosis written into `out_dir` (the staging folder of `name`'s generation)."""
    neurons = NeuronCollector(model.blocks, neuron_k(st.high_norm_k), model.num_prefix) if st.residual else None
    d = diagnose(model, images, batch_size, keep_maps=max(4, st.report_images if st.report else 0), neurons=neurons)
    if image_index is not None:
        d["image_index"] = np.asarray(image_index, dtype=np.int64)
    rules = SinkRules.from_config(st)
    result = DiagnosticsSummary.from_json(summarize(d, rules, residual=st.residual,
                                                    high_norm_k=list(st.high_norm_k)))
    if neurons is not None and result.residual is not None:  # neurons: collected with st.residual
        result.residual["register_neurons"] = summarize_neurons(model, None, st, neurons.got)
    result.protocol = str((selection or SelectionConfig()).name)
    summary = result.to_json()
    with files.atomic_open(out_dir / PER_IMAGE, "wb") as f:
        arrays: dict[str, Any] = {k: v for k, v in d.items() if k != "attn_col_mean"}  # (savez's allow_pickle: bool)
        np.savez_compressed(f, **arrays)
    result.write(out_dir / SUMMARY)
    write_sink_table(d, out_dir, block0=bool(getattr(st, "block0", False)), protocol=result.protocol,
                     block0_policy=rules.block0_policy)
    if st.plots:
        all_plots(d, summary, shown, out_dir, st.ratio)
    if st.report:
        checkpoint_report(model, images, shown, d, summary, out_dir, st.report_images, quant=quant, trainfree=trainfree,
                          name=name)
    return summary
