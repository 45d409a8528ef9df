"""Frozen-backbone evaluation: linear probe, dense probes, and what a finished run gets with eval.after_train."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

SEGMENTATION_DATA = ("synthetic", "fashion_mnist", "ade20k", "voc")  # fashion_mnist: mosaics


def after_train(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Diagnostics, linear probe and dense probe of a finished run's `last.pt` (`eval.after_train=true`).

    The linear probe uses the training data; the dense probe uses it too when it has masks (synthetic), else
    `eval.dense_data` / `eval.dense_root` (ade20k or voc), else it is skipped.
    """
    from vitsinks.diagnose import diagnose_checkpoint
    from vitsinks.eval import dense, linear

    last = run_dir / "checkpoints" / "last.pt"
    out: dict[str, Any] = {}
    diag = diagnose_checkpoint(last, cfg, out_dir=run_dir / "diagnostics" / "final")
    out["sinks_per_image"] = diag["sinks_per_image"]
    ev = OmegaConf.merge(cfg, {"ckpt": str(last)})
    out["linear"] = linear.run(ev)["best"]
    name, root = cfg.eval.dense_data or cfg.data.name, cfg.eval.dense_root or cfg.data.root
    if name in SEGMENTATION_DATA:
        dense_cfg = OmegaConf.merge(ev, {"data": {"name": name, "root": root}} if name != cfg.data.name else {})
        if name != cfg.data.name:
            dense_cfg.data.num_classes = {"ade20k": 150, "voc": 21}[name]
        out["dense"] = {k: v for k, v in dense.run(dense_cfg).items() if k in ("mIoU", "pixel_acc", "data")}
    return out
