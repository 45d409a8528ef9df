"""Which images an analysis reads and how they are preprocessed, against independent statements of the reference's
protocols: torch.randperm with a seeded generator, and PIL's own bicubic resize."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset

from vitsinks.configs.schema import SelectionConfig, load_config
from vitsinks.data import BadImage
from vitsinks.data.selection import analysis_transform, read_list, select_items, split_order
from vitsinks.models import model_from_config
from vitsinks.utils.errors import BadValue, InputNotFound


class Indices(Dataset):
    """A split of `n` items whose item i is (i, i): cheap stand-in for a 50,000-image validation split."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, i


def test_the_shipped_ade20k_list_is_the_reference_permutation_of_the_sorted_names() -> None:
    names = sorted(f"ADE_val_{i:08d}.jpg" for i in range(1, 2001))  # the ADE20K validation split's 2,000 files
    perm = torch.randperm(2000, generator=torch.Generator().manual_seed(0))
    assert read_list("ade20k_val_1984.txt") == [names[int(i)] for i in perm[:1984]]  # 62 batches of 32


def test_the_causal_preset_edits_the_first_4096_of_the_permutation_and_holds_out_the_next_4096() -> None:
    cfg = load_config(["selection=kempner_causal"])
    (edit, edit_idx), (held, held_idx) = select_items(Indices(50000), [cfg.intervene.n_images,
                                                                       cfg.intervene.heldout_images], cfg.selection)
    perm = torch.randperm(50000, generator=torch.Generator().manual_seed(0)).tolist()
    assert edit_idx == perm[:4096] and held_idx == perm[4096:8192]
    assert [i for i, _ in edit] == edit_idx and not set(edit_idx) & set(held_idx)
    assert cfg.intervene.batch_size == 32 and cfg.selection.crop_pct == 0.875


def test_the_default_order_is_a_seeded_permutation_not_the_first_files() -> None:
    order = split_order(Indices(1000), SelectionConfig())
    assert order == torch.randperm(1000, generator=torch.Generator().manual_seed(0)).tolist()
    assert split_order(Indices(1000), SelectionConfig(seed=3)) != order
    assert split_order(Indices(5), SelectionConfig(order="first")) == [0, 1, 2, 3, 4]
    # ImageFolder order is sorted by class: 256 images of 50 per class in a row would be about 6 classes
    classes = {i // 50 for i in order[:256]}
    assert len(classes) > 15


class Flaky(Indices):
    """Items 3 and 7 cannot be read."""

    def __getitem__(self, i: int) -> tuple[int, int]:
        if i in (3, 7):
            raise BadImage(f"cannot decode image {i}.jpg")
        return i, i


def test_unreadable_images_are_skipped_and_the_groups_stay_disjoint() -> None:
    proto = SelectionConfig(order="first")
    (_, a), (_, b) = select_items(Flaky(12), [4, 4], proto)
    assert a == [0, 1, 2, 4] and b == [5, 6, 8, 9]
    with pytest.raises(BadValue, match="readable"):
        select_items(Flaky(12), [6, 5], proto)
    with pytest.raises(BadValue, match="has 12"):
        select_items(Flaky(12), [10, 5], proto)
    with pytest.raises(BadImage):
        select_items(Flaky(12), [5], proto, on_bad_image="error")


def test_an_image_list_needs_file_backed_data_and_every_listed_file(tmp_path: Path) -> None:
    with pytest.raises(BadValue, match="image_list"):
        split_order(Indices(10), SelectionConfig(image_list="ade20k_val_1984.txt"))
    with pytest.raises(InputNotFound, match="no such file"):
        read_list("nowhere.txt")


def test_analysis_preprocessing_is_resize_256_bicubic_centre_crop_224_imagenet_normalised() -> None:
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8))  # H 300, W 400
    got = analysis_transform(224)(img)
    small = img.resize((int(256 * 400 / 300), 256), Image.Resampling.BICUBIC)  # shorter side 256, by PIL itself
    top, left = round((256 - 224) / 2), round((small.width - 224) / 2)
    crop = np.asarray(small, dtype=np.float64)[top : top + 224, left : left + 224] / 255
    want = (crop - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    assert got.dtype == torch.float32 and got.shape == (3, 224, 224)
    assert np.abs(got.permute(1, 2, 0).double().numpy() - want).max() < 1e-5


def _ade20k(root: Path, n: int = 2000) -> Path:
    """An ADE20K layout with the validation split's n file names (tiny images, one-class label maps)."""
    base = root / "ADEChallengeData2016"
    for sub in ("images", "annotations"):
        for split in ("training", "validation"):
            (base / sub / split).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, prefix, count in (("validation", "ADE_val", n), ("training", "ADE_train", 2)):
        for i in range(1, count + 1):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(
                base / "images" / split / f"{prefix}_{i:08d}.jpg")
            Image.fromarray(np.full((20, 24), 1, dtype=np.uint8)).save(
                base / "annotations" / split / f"{prefix}_{i:08d}.png")
    return root


@pytest.mark.slow
def test_diagnose_with_the_sink_table_preset_reads_the_reference_images_in_its_order(tmp_path: Path) -> None:
    root = _ade20k(tmp_path / "ade")
    out, weights = tmp_path / "runs", tmp_path / "tiny.pth"
    arch = ["model.depth=2", "model.img_size=32"]
    torch.save(model_from_config(load_config(arch).model).state_dict(), weights)
    cmd = [sys.executable, "-m", "vitsinks.diagnose", "selection=kempner_sinktable", "data=ade20k",
           f"data.root={root}", *arch, f"model.pretrained={weights}", "n_images=3", f"runs_dir={out}",
           "diagnostics.plots=false"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    d = out / "tiny" / "diagnostics" / "last"  # the weights, imported as the run `tiny`
    perm = torch.randperm(2000, generator=torch.Generator().manual_seed(0)).tolist()
    assert np.load(d / "per_image.npz")["image_index"].tolist() == perm[:3]  # sorted names: index = file number - 1
    summary = json.loads((d / "summary.json").read_text())
    assert summary["protocol"] == "kempner_sinktable"
    # a split that lacks some of the listed files is refused, naming the problem
    for f in sorted((root / "ADEChallengeData2016" / "images" / "validation").glob("*.jpg"))[:10]:
        f.unlink()
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 1 and "are not in the split" in res.stderr and "Traceback" not in res.stderr
