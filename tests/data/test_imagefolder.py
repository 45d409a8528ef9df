"""The ImageFolder file-list cache: the same list as torchvision's scan, reused while nothing changed, never when
anything did, and never written from a folder that was still changing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

import vitsinks.data.imagefolder as imagefolder
from tests.helpers.tiny import tiny_cfg
from vitsinks.data.imagefolder import ImageFolderSplit, scan_folder


def tree(root: Path) -> Path:
    """A train split with nested folders, names that sort differently as paths than depth-first, non-images, upper
    case extensions and a linked folder; every folder's mtime an hour ago."""
    files = ["b/x.JPEG", "b/sub/y.jpg", "b/sub-z/w.png", "b/sub/deep/v.JPG", "b/notes.txt", "a/1.jpeg", "a/0.JPEG",
             "c/only.PNG"]
    for f in files:
        path = root / "train" / f
        path.parent.mkdir(parents=True, exist_ok=True)
        if f.endswith(".txt"):
            path.write_text("not an image")
        else:
            Image.new("RGB", (8, 8), (len(f) * 20, 10, 10)).save(path, format="PNG" if "png" in f.lower() else "JPEG")
    (root / "elsewhere").mkdir()
    Image.new("RGB", (8, 8)).save(root / "elsewhere" / "linked.jpg")
    os.symlink(root / "elsewhere", root / "train" / "a" / "link")
    age(root)
    return root


def age(root: Path, seconds: float = 3600) -> None:
    past = time.time() - seconds
    for d, _, _ in os.walk(root):
        os.utime(d, (past, past))


def test_scan_lists_what_torchvision_lists_in_its_order(tmp_path: Path) -> None:
    split = str(tree(tmp_path) / "train")
    classes = {"a": 0, "b": 1, "c": 2}
    samples, mtimes = scan_folder(split, classes, IMG_EXTENSIONS)
    assert samples == make_dataset(split, classes, IMG_EXTENSIONS)
    assert any(p.endswith("link/linked.jpg") for p, _ in samples)
    assert set(mtimes) == {split, *(os.path.join(split, d) for d in
                                    ("a", "a/link", "b", "b/sub", "b/sub/deep", "b/sub-z", "c"))}


def test_the_cache_is_reused_while_nothing_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, cache = tree(tmp_path), tmp_path / "cache"
    first = ImageFolderSplit(root, "train", cache=cache)
    assert len(list(cache.glob("*.tsv"))) == 1
    monkeypatch.setattr(imagefolder, "scan_folder", lambda *a: pytest.fail("scanned again"))
    again = ImageFolderSplit(root, "train", cache=cache)
    assert again.samples == first.samples == make_dataset(str(root / "train"), first.class_to_idx, IMG_EXTENSIONS)
    assert again.targets == first.targets and again.classes == first.classes == ["a", "b", "c"]
    assert again[0][0].size == (8, 8)


@pytest.mark.parametrize("change", ["add_nested", "remove", "rename", "add_class", "linked_folder"])
def test_any_change_of_the_listing_is_seen(tmp_path: Path, change: str) -> None:
    root, cache = tree(tmp_path), tmp_path / "cache"
    ImageFolderSplit(root, "train", cache=cache)
    train = root / "train"
    if change == "add_nested":
        Image.new("RGB", (8, 8)).save(train / "b" / "sub" / "deep" / "new.jpg")
    elif change == "remove":
        (train / "a" / "0.JPEG").unlink()
    elif change == "rename":
        (train / "b" / "x.JPEG").rename(train / "b" / "x2.JPEG")
    elif change == "add_class":
        (train / "d").mkdir()
        Image.new("RGB", (8, 8)).save(train / "d" / "d.jpg")
    else:
        Image.new("RGB", (8, 8)).save(root / "elsewhere" / "new.jpg")
    now = ImageFolderSplit(root, "train", cache=cache)
    assert now.samples == make_dataset(str(train), now.class_to_idx, IMG_EXTENSIONS)


def test_a_folder_that_just_changed_is_not_cached_and_a_broken_cache_is_rescanned(tmp_path: Path) -> None:
    root, cache = tree(tmp_path), tmp_path / "cache"
    Image.new("RGB", (8, 8)).save(root / "train" / "c" / "fresh.jpg")  # c's mtime: now
    ImageFolderSplit(root, "train", cache=cache)
    assert not list(cache.glob("*.tsv"))
    age(root)
    expected = ImageFolderSplit(root, "train", cache=cache).samples
    (written,) = cache.glob("*.tsv")
    written.write_text(written.read_text()[:-40])  # truncated
    assert ImageFolderSplit(root, "train", cache=cache).samples == expected
    written.write_text("not json\n")
    assert ImageFolderSplit(root, "train", cache=cache).samples == expected


def test_no_cache_folder_means_no_file_and_imagenet_caches_beside_the_runs(tmp_path: Path) -> None:
    root = tree(tmp_path)
    before = sorted(p for p in tmp_path.rglob("*"))
    ImageFolderSplit(root, "train")
    assert sorted(p for p in tmp_path.rglob("*")) == before
    cfg = tiny_cfg(tmp_path / "runs", "data=imagenet", f"data.root={root}")
    assert cfg.data.file_list_cache == str(tmp_path / "runs" / "file_lists")
