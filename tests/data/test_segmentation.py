"""The segmentation readers' answers to a dataset on disk that lacks what the settings ask for."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.datasets import voc_folder
from vitsinks.data.segmentation import SegmentationError, voc


def test_voc_aug_without_the_augmented_set_names_it_and_the_way_out(tmp_path: Path) -> None:
    root = voc_folder(tmp_path)
    base = root / "VOCdevkit" / "VOC2012"
    with pytest.raises(SegmentationError) as err:
        voc(root, "train", aug=True)
    assert str(err.value) == (f"data.voc_aug=true needs the augmented set (SBD), but {base} has no "
                              f"SegmentationClassAug and no train_aug.txt: add SegmentationClassAug/ and "
                              f"ImageSets/Segmentation/train_aug.txt there, or drop data.voc_aug")
    shutil.copy(base / "ImageSets/Segmentation/train.txt", base / "ImageSets/Segmentation/train_aug.txt")
    with pytest.raises(SegmentationError, match="has no SegmentationClassAug: .* or drop data.voc_aug"):
        voc(root, "train", aug=True)
    shutil.copytree(base / "SegmentationClass", base / "SegmentationClassAug")
    assert len(voc(root, "train", aug=True)) == 1
    assert len(voc(root, "val", aug=True)) == 2  # the augmented set is the training split's only
