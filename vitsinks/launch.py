"""Main entry point: `python -m vitsinks.launch exp=gate+reg [model=... data=... train=... cluster=...]`."""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from vitsinks.checkpoint import CheckpointMismatch
from vitsinks.config import config_dir, register_configs
from vitsinks.data import BadImage
from vitsinks.train import NonFiniteLoss, Trainer

log = logging.getLogger("vitsinks")

# Errors that mean "the input is wrong", not "vitsinks is broken": one readable line, non-zero exit.
USER_ERRORS = (FileNotFoundError, NotADirectoryError, CheckpointMismatch, NonFiniteLoss, BadImage, ValueError)


def run(cfg: DictConfig) -> dict:
    """Train one run in this process (rank layout from torchrun/SLURM variables) and return its summary."""
    trainer = Trainer(cfg)
    n = sum(p.numel() for p in trainer.model.backbone.parameters())
    if trainer.dist.is_main:
        print(f"vitsinks: {trainer.model.backbone.variant} {cfg.model.size} ({n / 1e6:.2f}M parameters, "
              f"{trainer.model.backbone.tokens_per_image()} tokens per image) on {cfg.data.name}, "
              f"{trainer.total_steps} steps, device {trainer.device}, {trainer.dist.world} rank(s)")
        print(f"run directory: {trainer.run_dir}")
    summary = trainer.fit()
    if trainer.dist.is_main:
        print(f"{summary['status']} at step {summary['step']}: loss {summary.get('loss', float('nan')):.4f}, "
              f"online probe val top-1 {summary.get('val/probe_acc', float('nan')):.3f}")
        print(f"outputs: {trainer.run_dir}/config.yaml, metrics.jsonl, checkpoints/last.pt")
        print("next: relaunch the same command to resume or extend (train.epochs=...), or train the other variants "
              "with exp=base|gate|reg|gate+reg")
    return summary


def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except USER_ERRORS as err:
        if os.environ.get("VITSINKS_TRACEBACK"):
            raise
        log.error("error: %s", err)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


register_configs()
hydra_main = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(main)

if __name__ == "__main__":
    hydra_main()
