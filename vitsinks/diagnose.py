"""Sink diagnostics from the command line.

    python -m vitsinks.diagnose ckpt=runs/<name>/checkpoints/last.pt [data=fashion_mnist] [n_images=32]
    python -m vitsinks.diagnose run=runs/<name>          # every checkpoint of a run + the over-training plot
    python -m vitsinks.diagnose model=vit_small model.pretrained=<timm name or file> data=imagenet data.root=...
    python -m vitsinks.diagnose hub=hf:facebook/dinov2-small data=imagenet data.root=...   # read unmodified
    python -m vitsinks.diagnose run=runs/trainfree/hf_<folder>+test_time_register      # a derived run: its last.pt

The model is any source a command takes (`ckpt=`, `run=`, `model.pretrained=`, `hub=`; docs/commands.md#diagnose).
Outputs go to `<run>/diagnostics/<checkpoint>/` (`per_image.npz`, `summary.json`, PNG plots, `report.html`); `run=`
of a trained run adds the over-training plot and tables, the training curves and the run's page in `<run>/diagnostics/`.
A pretrained model's run is its import (`<runs_dir>/<model>/`); a loose checkpoint file's or a `hub=` model's
outputs go to `<runs_dir>/diagnostics/<model>/`.
`diagnostics.residual=false` / `diagnostics.report=false` leave the residual side / the pages out.
"""

from __future__ import annotations

import json

from omegaconf import DictConfig

from vitsinks.configs.cli import data_overrides, hydra_command
from vitsinks.run.diagnosed import diagnose_model, over_training
from vitsinks.run.source import resolve
from vitsinks.utils.rundir import RunDir


def over_a_run(run: RunDir) -> bool:
    """`run=` names a run to diagnose over training, not one model (an import, a derived run)."""
    return bool(run.step_checkpoints() or run.diagnosed_steps()) or not run.last.is_file()


def main(cfg: DictConfig) -> None:
    source = resolve(cfg)
    if source.run is not None and source.kind == "run" and source.trained and over_a_run(source.run):
        rows = over_training(source.run.path, cfg)
        print(f"diagnosed {len(rows)} checkpoints; see {source.run.over_training('png')}")
        return
    out, s = diagnose_model(source, cfg, data_overrides())
    print(json.dumps(s["sinks_per_image"], indent=1))
    print(f"outputs in {out}")


cli = hydra_command(main, aliases={"n_images": "diagnostics.n_images"})

if __name__ == "__main__":
    cli()
