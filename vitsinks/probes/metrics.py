"""Segmentation metrics from one confusion matrix (rows: ground truth, columns: prediction)."""

from __future__ import annotations

import math

import torch

from vitsinks.utils.errors import BadValue


def iou_from_confusion(conf: torch.Tensor, classes: str = "present") -> dict[str, object]:
    """Per-class IoU = TP / (TP + FP + FN), pixel accuracy = TP / labelled pixels, and mIoU: with
    `classes="present"` the mean over the classes in prediction or ground truth (an absent class has IoU None),
    with `classes="all"` the mean over every class, an absent one counting as 0 (the reference's ignite IoU)."""
    if classes not in ("present", "all"):
        raise BadValue(f"mIoU classes={classes!r} (choose present or all)")
    conf = conf.double()
    tp = conf.diag()
    union = conf.sum(0) + conf.sum(1) - tp
    iou = torch.where(union > 0, tp / union.clamp_min(1), torch.nan if classes == "present" else 0.0)
    return {
        "mIoU": float(torch.nanmean(iou)) if (union > 0).any() or classes == "all" else float("nan"),
        "per_class_iou": [None if torch.isnan(x) else float(x) for x in iou],
        "pixel_acc": float(tp.sum() / conf.sum().clamp_min(1)),
    }


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population standard deviation (ddof 0) of a list of numbers (NaN for an empty list)."""
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
