"""mmseg's `IoUMetric` and the native dense probe give the same numbers for the same predictions: the same pixel
counts per class, the same mIoU and pixel accuracy, with mmseg's own datasets reading the labels (ADE20K's
reduce-zero-label, 255 ignored, the classes in the same order)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torchmetrics.classification import MulticlassConfusionMatrix

from tests.helpers.datasets import ade_folder, voc_folder
from tests.helpers.requirements import require
from tests.helpers.tiny import tiny_vit
from vitsinks.data.segmentation import IGNORE, ade20k, voc
from vitsinks.probes.dense_head import DenseHead, evaluate, slide_logits
from vitsinks.probes.metrics import iou_from_confusion
from vitsinks.probes.mmseg_adapter import register

require("mmseg")


def iou_metric(preds: list[torch.Tensor], labels: list[torch.Tensor], classes: list[str]) -> tuple[dict, dict]:
    """mmseg's `IoUMetric` over (prediction, label) pairs: (its summary as it prints it, its unrounded per-class
    values and summed pixel counts)."""
    from mmseg.evaluation import IoUMetric

    metric = IoUMetric(iou_metrics=["mIoU"])
    metric.dataset_meta = {"classes": classes}
    samples = [{"pred_sem_seg": {"data": p[None]}, "gt_sem_seg": {"data": g[None]}} for p, g in zip(preds, labels,
                                                                                                   strict=True)]
    metric.process({}, samples)
    areas = [sum(a) for a in zip(*metric.results, strict=True)]  # intersection, union, prediction, label
    per_class = metric.total_area_to_metrics(*areas, ["mIoU"])
    return metric.compute_metrics(metric.results), {"areas": areas, **per_class}


def native(preds: list[torch.Tensor], labels: list[torch.Tensor], classes: int) -> tuple[dict, torch.Tensor]:
    """The native probe's metrics over the same pairs: one confusion matrix, 255 ignored (`dense_head.evaluate`)."""
    conf = MulticlassConfusionMatrix(classes, ignore_index=IGNORE)
    for p, g in zip(preds, labels, strict=True):
        conf.update(p.flatten(), g.long().flatten())
    matrix = conf.compute()
    return iou_from_confusion(matrix), matrix


def test_identical_predictions_give_identical_counts_miou_and_pixel_accuracy() -> None:
    g = torch.Generator().manual_seed(0)
    labels = [torch.randint(0, 6, hw, generator=g) for hw in ((17, 23), (30, 8), (5, 5))]
    for lb in labels:
        lb[torch.rand(lb.shape, generator=g) < 0.2] = IGNORE  # ignored pixels, predictions there count for nothing
    preds = [torch.where(torch.rand(lb.shape, generator=g) < 0.7, lb.clamp(max=7), torch.randint(0, 8, lb.shape,
                                                                                                  generator=g))
             for lb in labels]  # classes 6 and 7 only predicted (IoU 0), class 5 absent from some images
    summary, theirs = iou_metric(preds, labels, [f"c{k}" for k in range(9)])  # class 8: in neither (no IoU)
    ours, conf = native(preds, labels, 9)
    intersect, union, pred, label = theirs["areas"]
    tp = conf.diag().double()
    assert torch.equal(intersect.double(), tp) and torch.equal(label.double(), conf.sum(1).double())
    assert torch.equal(pred.double(), conf.sum(0).double()) and torch.equal(union.double(), conf.sum(0) + conf.sum(1)
                                                                            - tp)
    assert summary["mIoU"] == round(100 * ours["mIoU"], 2) and summary["aAcc"] == round(100 * ours["pixel_acc"], 2)
    assert [np.isnan(v) for v in theirs["IoU"]] == [v is None for v in ours["per_class_iou"]]
    assert np.nan_to_num(theirs["IoU"], nan=-1).tolist() == pytest.approx([-1 if v is None else v
                                                                           for v in ours["per_class_iou"]], rel=1e-6)
    assert ours["per_class_iou"][8] is None and ours["per_class_iou"][7] == 0.0
    assert float(np.nanmean(theirs["IoU"])) == pytest.approx(ours["mIoU"], rel=1e-6)
    assert float(theirs["aAcc"]) == pytest.approx(ours["pixel_acc"], rel=1e-6)


@pytest.mark.parametrize("data", ["ade20k", "voc"])
def test_mmsegs_datasets_read_the_labels_the_native_probe_reads(tmp_path: Path, data: str) -> None:
    register()
    from mmseg.registry import DATASETS

    root = (ade_folder(tmp_path) / "ADEChallengeData2016") if data == "ade20k" else voc_folder(tmp_path)
    if data == "ade20k":
        ours = ade20k(tmp_path, "val")
        cfg = {"type": "ADE20KDataset", "data_root": str(root),
               "data_prefix": {"img_path": "images/validation", "seg_map_path": "annotations/validation"}}
    else:
        ours = voc(tmp_path, "val")
        cfg = {"type": "PascalVOCDataset", "data_root": str(root / "VOCdevkit/VOC2012"),
               "ann_file": "ImageSets/Segmentation/val.txt",
               "data_prefix": {"img_path": "JPEGImages", "seg_map_path": "SegmentationClass"}}
    theirs = DATASETS.build({**cfg, "pipeline": [{"type": "LoadImageFromFile"}, {"type": "LoadAnnotations"},
                                                 {"type": "PackSegInputs"}]})
    assert len(theirs) == len(ours) == 2
    for i in range(2):
        label = theirs[i]["data_samples"].gt_sem_seg.data[0].numpy()
        assert np.array_equal(label, ours[i][1])  # ADE20K: 0 -> 255, k -> k - 1; VOC: borders stay 255
    names = theirs.metainfo["classes"]
    if data == "ade20k":  # label value 1 of the files is "wall", class 0 of both; 150 is "flag", class 149
        assert (len(names), names[0], names[149]) == (150, "wall", "flag") and set(np.unique(label)) == {2, 149, 255}
    else:
        assert (len(names), names[0], names[1]) == (21, "background", "aeroplane")


@pytest.mark.parametrize("data", ["ade20k", "voc"])
def test_the_native_probes_predictions_scored_by_mmseg_give_its_numbers(tmp_path: Path, data: str) -> None:
    register()
    from mmseg.registry import DATASETS

    torch.manual_seed(0)
    classes = 150 if data == "ade20k" else 21
    model, head = tiny_vit().eval(), DenseHead(48, classes).eval()
    with torch.no_grad():  # predictions among a few classes, not all of them right
        head.conv.bias.fill_(-20.0)
        some = [2, 149, 5] if data == "ade20k" else [0, 1, 5]  # the classes present, and class 5
        head.conv.bias[some] = 0.0
        head.conv.weight[some] = torch.randn(3, 48, 1, 1)
    ds = ade20k(ade_folder(tmp_path), "val") if data == "ade20k" else voc(voc_folder(tmp_path), "val")
    ours = evaluate(model, head, ds, classes, 32)  # the native probe's own evaluation
    base = Path(ds.pairs[0][0]).parents[2 if data == "ade20k" else 1]
    prefix = ("images/validation", "annotations/validation") if data == "ade20k" else ("JPEGImages",
                                                                                       "SegmentationClass")
    theirs = DATASETS.build({"type": "ADE20KDataset" if data == "ade20k" else "PascalVOCDataset",
                             "data_root": str(base), "data_prefix": dict(zip(("img_path", "seg_map_path"), prefix,
                                                                             strict=True)),
                             **({} if data == "ade20k" else {"ann_file": "ImageSets/Segmentation/val.txt"}),
                             "pipeline": [{"type": "LoadAnnotations"}, {"type": "PackSegInputs"}]})
    preds = [slide_logits(model, head, img, 32, label.shape).argmax(0) for img, label in ds]
    summary, per_class = iou_metric(preds, [theirs[i]["data_samples"].gt_sem_seg.data[0] for i in range(len(ds))],
                                    list(theirs.metainfo["classes"]))
    assert 0 < ours["mIoU"] < 1 and 0 < ours["pixel_acc"] < 1  # neither all right nor all wrong
    assert summary["mIoU"] == round(100 * ours["mIoU"], 2) and summary["aAcc"] == round(100 * ours["pixel_acc"], 2)
    assert float(np.nanmean(per_class["IoU"])) == pytest.approx(ours["mIoU"], rel=1e-6)
