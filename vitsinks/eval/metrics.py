"""Segmentation metrics from one confusion matrix (rows: ground truth, columns: prediction)."""

from __future__ import annotations

import torch


def iou_from_confusion(conf: torch.Tensor) -> dict[str, object]:
    """Per-class IoU = TP / (TP + FP + FN) (NaN for a class absent from both), mIoU over the classes present,
    pixel accuracy = TP / labelled pixels."""
    conf = conf.double()
    tp = conf.diag()
    union = conf.sum(0) + conf.sum(1) - tp
    iou = torch.where(union > 0, tp / union.clamp_min(1), torch.nan)
    return {
        "mIoU": float(torch.nanmean(iou)) if (union > 0).any() else float("nan"),
        "per_class_iou": [None if torch.isnan(x) else float(x) for x in iou],
        "pixel_acc": float(tp.sum() / conf.sum().clamp_min(1)),
    }
