"""The diagnosis of a model of any source, of a checkpoint file and of a run over training: what
`python -m vitsinks.diagnose` writes, and what a run gets after training."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from vitsinks.configs.cli import pick_data
from vitsinks.configs.schema import to_container
from vitsinks.data import build_dataset
from vitsinks.diagnostics import run_diagnostics
from vitsinks.diagnostics.plots import over_training as plot_over_training
from vitsinks.diagnostics.run_page import run_report, training_curves
from vitsinks.pretrained.api import batch_size_for
from vitsinks.run.source import ModelSource, of_checkpoint, open_model
from vitsinks.utils import files
from vitsinks.utils.distributed import resolve_device
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.files import BadFile
from vitsinks.utils.progress import hidden
from vitsinks.utils.rundir import RunDir
from vitsinks.utils.tables import write_csv


def diagnose_checkpoint(path: Path, cfg: DictConfig, data_keys: Sequence[str] | None = (),
                        out_dir: Path | None = None) -> dict[str, Any]:
    """Diagnose one checkpoint (`diagnose_model` of the checkpoint file `path`); returns the summary."""
    return diagnose_model(of_checkpoint(Path(path)), cfg, data_keys, out_dir)[1]


def diagnose_model(source: ModelSource, cfg: DictConfig, data_keys: Sequence[str] | None = (),
                   out_dir: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """Diagnose the model `source` names on validation images of its data (or of `cfg.data`, `cli.pick_data` with
    `data_keys`) into `out_dir` (default `ModelSource.analyses`). Returns the folder and the summary."""
    if out_dir is None:
        source.analyses("diagnostics", cfg.runs_dir, claim=False)
    model = open_model(source, cfg).to(resolve_device(cfg.cluster.device))
    data = pick_data(cfg.data, model.cfg.data, data_keys)
    images, shown, index = model.pictures(build_dataset(data, "val", model.cfg.seed), cfg.diagnostics.n_images,
                                          cfg.selection, data.on_bad_image)
    source.write(model.module)  # a pretrained model's import: its diagnosis goes into it
    out = out_dir or source.analyses("diagnostics", cfg.runs_dir)
    edit = model.cfg.trainfree if source.trained or source.method else None
    trainfree = to_container(edit) if edit is not None and edit.method else None
    size = (int(images.shape[-2]), int(images.shape[-1]))
    batch = 16 if source.trained else batch_size_for(model.backbone, size)  # a hub model's: what fits in memory
    return out, run_diagnostics(model.backbone, images, shown, out, cfg.diagnostics, index, cfg.selection,
                                source.quant_result(cfg.runs_dir), trainfree, batch)


def over_training(run_dir: Path, cfg: DictConfig) -> list[tuple[int, dict[str, Any]]]:
    """Sinks vs step for a run (every `step_*.pt` without a fresh diagnosis diagnosed), plotted and tabled."""
    run = RunDir(run_dir)
    summaries = run.diagnosed_steps()
    ckpts = run.step_checkpoints()
    if not summaries and not ckpts:
        raise InputNotFound(f"no diagnostics and no checkpoints/step_*.pt in {run_dir}: is it a run directory?")
    read: dict[int, dict[str, Any]] = {}
    for step, path in summaries.items():
        try:
            read[step] = files.read_json(path, f"delete {path.parent} to leave step {step} out (its checkpoint is "
                                               f"gone, so it cannot be diagnosed again)")
        except BadFile:
            if step not in ckpts:
                raise
            print(f"{path} is torn: diagnosing its checkpoint again", flush=True)
    stale = [s for s, p in ckpts.items() if s not in read or summaries[s].stat().st_mtime < p.stat().st_mtime]
    for step in tqdm(sorted(stale), desc="diagnosing checkpoints", unit="ckpt", disable=hidden(not stale)):
        read[step] = diagnose_checkpoint(ckpts[step], cfg)
    rows = sorted(read.items())
    (run_report if cfg.diagnostics.report else training_curves)(run)  # the page writes training_curves.png too
    plot_over_training([s for s, _ in rows], [r for _, r in rows], run.over_training("png"))
    files.write_json(run.over_training("json"), [{"step": s, **r} for s, r in rows])
    write_csv(run.over_training("csv"),
              ["step", "sinks_per_image", "nop", "broadcast", "unclassified", "on_cls", "on_register", "on_patch",
               "block0", "peak_block"],
              [[s, r["sinks_per_image"]["all"]["all"], r["sinks_per_image"]["nop"]["all"],
                r["sinks_per_image"]["broadcast"]["all"], r["sinks_per_image"]["unclassified"]["all"],
                r["sinks_per_image"]["all"]["cls"], r["sinks_per_image"]["all"]["register"],
                r["sinks_per_image"]["all"]["patch"], r["sinks_per_image_block0"]["all"]["all"],
                int(max(range(len(r["block_frequency"])), key=r["block_frequency"].__getitem__))] for s, r in rows])
    return rows
