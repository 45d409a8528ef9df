"""Sink diagnostics from the command line.

    python -m vitsinks.diagnose ckpt=runs/<name>/checkpoints/last.pt [data=fashion_mnist] [n_images=32]
    python -m vitsinks.diagnose run=runs/<name>          # every checkpoint of a run + the over-training plot
    python -m vitsinks.diagnose model=dinov2_small_reg data=imagenet data.root=...   # a pretrained timm model

Outputs go to `<run>/diagnostics/<checkpoint>/` (`per_image.npz`, `summary.json`, PNG plots); `run=` adds
`<run>/diagnostics/over_training.{png,json,csv}`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from vitsinks.configs.cli import data_overrides, hydra_command, pick_data
from vitsinks.data import build_dataset
from vitsinks.diagnostics import fixed_images, run_diagnostics
from vitsinks.models import model_from_config
from vitsinks.train.checkpoint import load_backbone
from vitsinks.utils import files
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.rundir import RunDir


def diagnose_checkpoint(path: Path, cfg: DictConfig, data_keys: Sequence[str] | None = (),
                        out_dir: Path | None = None) -> dict[str, Any]:
    """Diagnose one checkpoint on `diagnostics.n_images` validation images (in the order of `protocol`) of its data,
    or of `cfg.data` as `cli.pick_data` decides from the command line's `data_keys` (default: none, the checkpoint's
    data)."""
    model, ckpt_cfg = load_backbone(path)
    data = pick_data(cfg.data, ckpt_cfg.data, data_keys)
    images, shown, index = fixed_images(build_dataset(data, "val", ckpt_cfg.seed), cfg.diagnostics.n_images,
                                        ckpt_cfg.views.global_size, data.get("on_bad_image", "skip"), cfg.protocol)
    out = out_dir or RunDir.of_checkpoint(path).diagnostics(path.stem)
    return run_diagnostics(model, images, shown, out, cfg.diagnostics, index, cfg.protocol)


def over_training(run_dir: Path, cfg: DictConfig) -> list[tuple[int, dict[str, Any]]]:
    """Sinks vs step for a run: the summaries the training hook wrote, plus a diagnosis of every `step_*.pt`
    checkpoint without a fresh one; then the plot and the tables."""
    from vitsinks.diagnostics.plots import over_training as plot_over_training

    run = RunDir(run_dir)
    diag = run.diagnostics_root
    summaries = run.diagnosed_steps()
    ckpts = run.step_checkpoints()
    stale = [s for s, p in ckpts.items() if s not in summaries or summaries[s].stat().st_mtime < p.stat().st_mtime]
    for step in tqdm(sorted(stale), desc="diagnosing checkpoints", unit="ckpt"):
        diagnose_checkpoint(ckpts[step], cfg)
        summaries[step] = run.diagnostics(ckpts[step].stem) / "summary.json"
    if not summaries:
        raise InputNotFound(f"no diagnostics and no checkpoints/step_*.pt in {run_dir}: is it a run directory?")
    rows = [(s, json.loads(summaries[s].read_text())) for s in sorted(summaries)]
    out = diag
    plot_over_training([s for s, _ in rows], [r for _, r in rows], out / "over_training.png")
    files.write_json(out / "over_training.json", [{"step": s, **r} for s, r in rows])
    with files.atomic_open(out / "over_training.csv", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "sinks_per_image", "nop", "broadcast", "unclassified", "on_cls", "on_register",
                    "on_patch", "block0", "peak_block"])
        for s, r in rows:
            spi = r["sinks_per_image"]
            freq = r["block_frequency"]
            w.writerow([s, spi["all"]["all"], spi["nop"]["all"], spi["broadcast"]["all"], spi["unclassified"]["all"],
                        spi["all"]["cls"], spi["all"]["register"], spi["all"]["patch"],
                        r["sinks_per_image_block0"]["all"]["all"], int(max(range(len(freq)), key=freq.__getitem__))])
    return rows


def main(cfg: DictConfig) -> None:
    if cfg.run:
        rows = over_training(Path(cfg.run), cfg)
        print(f"diagnosed {len(rows)} checkpoints; see {Path(cfg.run) / 'diagnostics' / 'over_training.png'}")
    elif cfg.ckpt:
        path = Path(cfg.ckpt)
        s = diagnose_checkpoint(path, cfg, data_overrides())
        print(json.dumps(s["sinks_per_image"], indent=1))
        print(f"outputs in {RunDir.of_checkpoint(path).diagnostics(path.stem)}")
    else:  # a model from the config, typically model.pretrained=<timm name or file>
        model = model_from_config(cfg.model)
        images, shown, index = fixed_images(build_dataset(cfg.data, "val", cfg.seed), cfg.diagnostics.n_images,
                                            model.patch_embed.img_size[0], cfg.data.on_bad_image, cfg.protocol)
        out = Path(cfg.runs_dir) / "diagnostics" / (cfg.model.pretrained or cfg.name).replace("/", "_")
        s = run_diagnostics(model, images, shown, out, cfg.diagnostics, index, cfg.protocol)
        print(json.dumps(s["sinks_per_image"], indent=1))
        print(f"outputs in {out}")


cli = hydra_command(main, aliases={"n_images": "diagnostics.n_images"})

if __name__ == "__main__":
    cli()
