"""Sink diagnostics from the command line.

    python -m vitsinks.diagnose ckpt=runs/<name>/checkpoints/last.pt [data=fashion_mnist] [n_images=32]
    python -m vitsinks.diagnose run=runs/<name>          # every checkpoint of a run + the over-training plot
    python -m vitsinks.diagnose model=vit_small model.pretrained=<timm name or file> data=imagenet data.root=...
    python -m vitsinks.diagnose hub=hf:facebook/dinov2-small data=imagenet data.root=...   # read unmodified

Outputs go to `<run>/diagnostics/<checkpoint>/` (`per_image.npz`, `summary.json` with the residual side, PNG
plots, the visual report `report.html`); `run=` adds `<run>/diagnostics/over_training.{png,json,csv}`, the
training curves `<run>/diagnostics/training_curves.png` and the run's page `<run>/diagnostics/report.html`.
`diagnostics.residual=false` / `diagnostics.report=false` leave the residual side / the pages out. A pretrained
model is imported as a run first (`run.imported`: `<runs_dir>/<model>/`), so its outputs sit in that run as a trained
run's do; a loose checkpoint file's go to `<runs_dir>/diagnostics/<model>/` (`utils.rundir.analyses_dir`).
`hub=` reads a timm, transformers or open_clip model unmodified, through `vitsinks.pretrained` (docs/pretrained.md),
with its own preprocessing; its outputs go to `<runs_dir>/diagnostics/<hub>/`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from vitsinks import pretrained
from vitsinks.configs.cli import data_overrides, hydra_command, pick_data
from vitsinks.configs.schema import to_container
from vitsinks.data import build_dataset
from vitsinks.data.selection import select_items
from vitsinks.diagnostics import fixed_images, run_diagnostics
from vitsinks.diagnostics.plots import over_training as plot_over_training
from vitsinks.diagnostics.run_page import run_report, training_curves
from vitsinks.pretrained.hub import hub_dir, load
from vitsinks.run.imported import checkpoint_of, one_model_source
from vitsinks.train.checkpoint import load_backbone
from vitsinks.utils import files
from vitsinks.utils.distributed import resolve_device
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.files import BadFile
from vitsinks.utils.progress import hidden
from vitsinks.utils.rundir import RunDir, analyses_dir, quant_result
from vitsinks.utils.tables import write_csv


def diagnose_checkpoint(path: Path, cfg: DictConfig, data_keys: Sequence[str] | None = (),
                        out_dir: Path | None = None) -> dict[str, Any]:
    """Diagnose one checkpoint on `diagnostics.n_images` validation images (in the order of `protocol`) of its data,
    or of `cfg.data` as `cli.pick_data` decides from the command line's `data_keys` (default: none, the checkpoint's
    data)."""
    model, ckpt_cfg = load_backbone(path)
    model = model.to(resolve_device(cfg.cluster.device))
    data = pick_data(cfg.data, ckpt_cfg.data, data_keys)
    images, shown, index = fixed_images(build_dataset(data, "val", ckpt_cfg.seed), cfg.diagnostics.n_images,
                                        ckpt_cfg.views.global_size, data.on_bad_image, cfg.protocol)
    out = out_dir or analyses_dir(path, "diagnostics", cfg.runs_dir)
    quant = quant_result(path, cfg.runs_dir)  # the page's W8A8 panel, if quantize made one of this checkpoint
    trainfree = to_container(ckpt_cfg.trainfree) if ckpt_cfg.trainfree.method else None
    return run_diagnostics(model, images, shown, out, cfg.diagnostics, index, cfg.protocol, quant, trainfree)


def over_training(run_dir: Path, cfg: DictConfig) -> list[tuple[int, dict[str, Any]]]:
    """Sinks vs step for a run: the summaries the training hook wrote, plus a diagnosis of every `step_*.pt`
    checkpoint without a fresh one; then the plot and the tables."""
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


def diagnose_hub(cfg: DictConfig) -> tuple[Path, dict[str, Any]]:
    """Diagnose the pretrained model `cfg.hub` (`pretrained.load`) unmodified, through `pretrained.report`, on
    `diagnostics.n_images` validation images of `cfg.data` (in the order of `protocol`) through the model's own
    preprocessing; the outputs go to `<runs_dir>/diagnostics/<hub>/` (`Loaded.folder_name`). Returns the folder
    and the summary."""
    out = hub_dir(cfg.hub, "diagnostics", cfg.runs_dir)  # a folder of another model's is refused before loading
    ((items, index),) = select_items(build_dataset(cfg.data, "val", cfg.seed), [cfg.diagnostics.n_images],
                                     cfg.protocol, cfg.data.on_bad_image, up_to=True)
    loaded = load(cfg.hub)
    loaded.model.to(resolve_device(cfg.cluster.device))
    x = loaded.images([it[0] for it in items])
    return out, pretrained.report(loaded.model, x, out, loaded.shown(x), cfg.diagnostics, image_index=index,
                                  protocol=cfg.protocol)


def main(cfg: DictConfig) -> None:
    one_model_source(cfg)
    if cfg.hub:
        out, s = diagnose_hub(cfg)
        print(json.dumps(s["sinks_per_image"], indent=1))
        print(f"outputs in {out}")
        return
    if cfg.run:
        rows = over_training(Path(cfg.run), cfg)
        print(f"diagnosed {len(rows)} checkpoints; see {RunDir(cfg.run).over_training('png')}")
        return
    path = checkpoint_of(cfg)  # a pretrained model (model.pretrained=) is read as its imported run's checkpoint
    s = diagnose_checkpoint(path, cfg, data_overrides())
    print(json.dumps(s["sinks_per_image"], indent=1))
    print(f"outputs in {analyses_dir(path, 'diagnostics', cfg.runs_dir)}")


cli = hydra_command(main, aliases={"n_images": "diagnostics.n_images"})

if __name__ == "__main__":
    cli()
