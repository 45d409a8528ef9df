"""Datasets, views and the sampler."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.datasets import imagefolder
from tests.helpers.requirements import require_fashion_mnist
from vitsinks.configs.schema import DataConfig, ViewsConfig
from vitsinks.data import (
    FASHION_MNIST_ROOT,
    BadImage,
    FashionMNIST,
    ImageFolderSplit,
    build_dataset,
    read_item,
)
from vitsinks.data.crops import EpochSampler, SeededViews, collate_views, view_transform
from vitsinks.data.fashion_mnist import read_idx
from vitsinks.data.synthetic_images import SyntheticShapes, class_spec, render
from vitsinks.utils.errors import BadValue


def test_synthetic_is_deterministic_and_seeded() -> None:
    a, b = render(3, 17, 48, 10), render(3, 17, 48, 10)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    assert not np.array_equal(render(4, 17, 48, 10)[0], a[0])
    assert not np.array_equal(render(3, 18, 48, 10)[0], a[0])


def test_synthetic_any_resolution_draws_the_same_scene() -> None:
    small_img, small_mask, label = render(0, 5, 32, 10)
    big_img, big_mask, big_label = render(0, 5, 128, 10)
    assert big_img.shape == (128, 128, 3) and small_img.shape == (32, 32, 3) and label == big_label
    down = np.array(Image.fromarray(big_mask).resize((32, 32), Image.NEAREST))
    assert (down == small_mask).mean() > 0.9


def test_synthetic_mask_marks_the_main_object_with_its_class() -> None:
    ds = SyntheticShapes(size=64, length=50, num_classes=7)
    for i in range(50):
        img, mask, label = ds.sample(i)
        assert img.dtype == np.uint8 and mask.shape == (64, 64)
        values, counts = np.unique(mask[mask > 0], return_counts=True)
        assert values[np.argmax(counts)] == label + 1  # the main object is the largest labelled region
        assert mask.max() <= 7 and (mask == 0).mean() > 0.3  # background remains
    labels = ds.targets
    assert set(labels) == set(range(7))
    assert len({class_spec(k, 12)[:2] for k in range(12)}) == 12  # classes are distinct shape x texture pairs


def _write_idx(path: Path, arr: np.ndarray) -> None:
    header = b"\x00\x00\x08" + bytes([arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_idx_reader_round_trip_and_truncation(tmp_path: Path) -> None:
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "x.gz", arr)
    assert np.array_equal(read_idx(tmp_path / "x.gz"), arr)
    (tmp_path / "y").write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 10) + b"abc")
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "y")


def test_fashion_mnist_from_a_folder_of_idx_files(tmp_path: Path) -> None:
    imgs = np.random.default_rng(0).integers(0, 255, (6, 28, 28))
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", imgs)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([0, 1, 2, 3, 4, 9]))
    ds = FashionMNIST(tmp_path, "val", size=32)
    img, label = ds[5]
    assert len(ds) == 6 and label == 9 and img.size == (32, 32) and img.mode == "RGB"
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        FashionMNIST(tmp_path, "train")


def test_real_fashion_mnist_package() -> None:
    require_fashion_mnist()
    ds = build_dataset(DataConfig(name="fashion_mnist", root=FASHION_MNIST_ROOT), "val")
    assert len(ds) == 10_000 and sorted(set(ds.targets)) == list(range(10))


def test_imagefolder_layout_and_corrupt_file(tmp_path: Path) -> None:
    for cls in ("n01440764", "n01443537"):
        (tmp_path / "train" / cls).mkdir(parents=True)
        Image.new("RGB", (20, 20), "red").save(tmp_path / "train" / cls / "a.JPEG")
    (tmp_path / "train" / "n01443537" / "b.JPEG").write_bytes(b"garbage")
    ds = ImageFolderSplit(tmp_path, "train")
    assert ds.classes == ["n01440764", "n01443537"] and len(ds) == 3
    assert ds[0][0].size == (20, 20)
    with pytest.raises(BadImage, match="b.JPEG"):
        ds[2]
    with pytest.raises(FileNotFoundError, match="val/<class>"):
        ImageFolderSplit(tmp_path, "val")


def test_seeded_views_are_reproducible_and_leave_global_rngs_alone() -> None:
    base = SyntheticShapes(size=32, length=4)
    ds = SeededViews(base, view_transform(ViewsConfig(global_size=32, local_size=16, n_local=2)), seed=0)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    v1, label = ds[1]
    assert torch.equal(torch.get_rng_state(), before)
    assert len(v1) == 4 and v1[0].shape == (3, 32, 32) and v1[3].shape == (3, 16, 16)
    assert all(torch.equal(a, b) for a, b in zip(v1, ds[1][0], strict=True))
    assert not torch.equal(v1[0], v1[1])  # two different global views
    ds.epoch = 1
    assert not torch.equal(ds[1][0][0], v1[0])  # a new epoch draws new views


def test_collate_drops_and_counts_bad_images() -> None:
    item = ([torch.zeros(3, 4, 4), torch.ones(3, 2, 2)], 1)
    views, labels, n_bad = collate_views([item, None, item])
    assert n_bad == 1 and labels.tolist() == [1, 1] and views[0].shape == (2, 3, 4, 4)


def test_sampler_shards_union_equals_single_process_batches() -> None:
    single = list(EpochSampler(40, 8, seed=0))
    r0, r1 = list(EpochSampler(40, 8, seed=0, rank=0, world=2)), list(EpochSampler(40, 8, seed=0, rank=1, world=2))
    for b in range(5):
        assert sorted(r0[4 * b : 4 * b + 4] + r1[4 * b : 4 * b + 4]) == sorted(single[8 * b : 8 * b + 8])
    s = EpochSampler(40, 8, seed=0)
    s.set_epoch(0, start_batch=3)
    assert list(s) == single[24:] and len(s) == 16
    s.set_epoch(1)
    assert list(s) != single and sorted(s) == sorted(single)
    with pytest.raises(ValueError, match="not divisible"):
        EpochSampler(40, 8, seed=0, world=3)


def test_class_indices_come_from_the_train_split(tmp_path: Path) -> None:
    root = imagefolder(tmp_path, {"a": (2, 1), "b": (2, 0), "c": (2, 1)})
    (root / "val" / "b").rmdir()  # the val split lacks a class folder
    with pytest.raises(BadValue, match="missing: b"):
        build_dataset(DataConfig(name="imagenet", root=str(root)), "val")
    (root / "val" / "b").mkdir()  # an empty folder is fine: the labels keep the train split's numbering
    val = build_dataset(DataConfig(name="imagenet", root=str(root)), "val")
    assert val.classes == ["a", "b", "c"] and [label for _, label in val.samples] == [0, 2]
    (root / "val" / "d").mkdir()
    Image.new("RGB", (8, 8)).save(root / "val" / "d" / "x.JPEG")
    with pytest.raises(BadValue, match="not in train: d"):
        build_dataset(DataConfig(name="imagenet", root=str(root)), "val")


def test_read_item_skips_or_names_a_bad_image(tmp_path: Path) -> None:
    root = imagefolder(tmp_path, {"a": (2, 0)})
    (root / "train" / "a" / "1.JPEG").write_bytes(b"not a jpeg")
    ds = ImageFolderSplit(root, "train")
    assert read_item(ds, 0)[1] == 0 and read_item(ds, 1, "skip") is None
    with pytest.raises(BadImage, match=r"1\.JPEG.*on_bad_image=skip"):
        read_item(ds, 1, "error")
