"""Evaluation: metrics with exact answers, the linear grid, dataset readers in their real layouts, bad input."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.commands import one_line_error, run_command, run_module
from tests.helpers.datasets import ade_folder, imagefolder, voc_folder
from tests.helpers.requirements import require_fashion_mnist
from tests.helpers.tiny import TINY, eval_cfg, tiny_cfg, tiny_vit, trained
from vitsinks.configs.schema import DataConfig
from vitsinks.data.segmentation import IGNORE, SegmentationError, ade20k, build_seg_dataset, reduce_zero_label, voc
from vitsinks.eval import dense
from vitsinks.probes.dense_head import DenseHead, evaluate, predict_examples
from vitsinks.probes.dense_protocols import DENSE_PROTOCOLS
from vitsinks.probes.linear_grid import train_grid
from vitsinks.probes.metrics import iou_from_confusion
from vitsinks.train.trainer import Trainer


def test_miou_per_class_iou_and_pixel_accuracy_by_hand() -> None:
    conf = torch.tensor([[5, 1, 0], [2, 3, 0], [0, 0, 0]])  # class 2 never appears: no IoU, not in the mean
    r = iou_from_confusion(conf)
    # class 0: TP 5, FP 2, FN 1 -> 5/8; class 1: TP 3, FP 1, FN 2 -> 3/6
    assert r["per_class_iou"] == [5 / 8, 0.5, None]
    assert r["mIoU"] == pytest.approx((5 / 8 + 0.5) / 2)
    assert r["pixel_acc"] == pytest.approx(8 / 11)


class _Constant(torch.utils.data.Dataset):
    def __init__(self, label: np.ndarray) -> None:
        self.label = label
        self.num_classes = 3

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int):
        return Image.new("RGB", self.label.shape[::-1], (90, 90, 90)), self.label


def test_ignore_index_is_left_out_of_the_confusion_matrix() -> None:
    torch.manual_seed(0)
    model = tiny_vit(depth=1).eval()
    head = DenseHead(48, 3).eval()
    with torch.no_grad():
        head.conv.weight.zero_()
        head.conv.bias.copy_(torch.tensor([0.0, 5.0, 0.0]))  # predicts class 1 everywhere
    label = np.full((40, 48), IGNORE, np.uint8)  # larger than the model input: sliding window
    label[:10, :] = 1
    label[10:12, :] = 2
    metrics = evaluate(model, head, _Constant(label), 3, 32)
    shown = predict_examples(model, head, _Constant(label), replace(DENSE_PROTOCOLS["dinov2"], size=32), 1)
    conf = torch.tensor(metrics["confusion"])
    assert conf.sum() == 12 * 48 and conf[1, 1] == 10 * 48 and conf[2, 1] == 2 * 48
    assert metrics["pixel_acc"] == pytest.approx(10 / 12)
    assert shown[0][2].shape == (40, 48)  # prediction at full label resolution


def test_reduce_zero_label() -> None:
    lab = np.array([[0, 1, 2], [150, 0, 7]], np.uint8)
    assert reduce_zero_label(lab).tolist() == [[255, 0, 1], [149, 255, 6]]


def test_linear_probe_reaches_100_percent_on_separable_features() -> None:
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 16, generator=g) * 4

    def feats(n: int) -> dict[str, torch.Tensor]:
        y = torch.randint(0, 4, (n,), generator=g)
        cls = (centers[y] + 0.3 * torch.randn(n, 16, generator=g))[:, None].repeat(1, 4, 1)
        return {"cls": cls.half(), "patch_mean": torch.randn(n, 16, generator=g).half(), "label": y}

    cells = train_grid(feats(400), feats(200), 4, [1e-3, 1e-2, 1e-1], [1, 4], epochs=5, batch_size=64)
    assert len(cells) == 3 * 2 * 2
    assert cells[0]["top1"] == 100.0 and cells[0]["top4"] == 100.0
    assert {c["pool"] for c in cells} == {"cls", "cls+avgpool"} and {c["n_last"] for c in cells} == {1, 4}


def test_ade20k_reader(tmp_path: Path) -> None:
    ds = ade20k(ade_folder(tmp_path), "val")
    img, lab = ds[0]
    assert len(ds) == 2 and img.size == (24, 16)
    assert set(np.unique(lab)) == {2, 149, IGNORE}  # 3 -> 2, 150 -> 149, 0 -> ignore
    cfg = DataConfig(name="ade20k", root=str(tmp_path), num_classes=150)
    assert len(build_seg_dataset(cfg, "train")) == 2


def test_voc_reader_reads_palette_pngs(tmp_path: Path) -> None:
    ds = voc(voc_folder(tmp_path), "val")
    assert len(ds) == 2
    img, lab = ds[1]
    assert Image.open(ds.pairs[1][1]).mode == "P"
    assert lab.shape == (10, 20) and lab[5, 10] == 1 and lab[0, 0] == 0 and (lab[1] == IGNORE).all()


def test_segmentation_bad_input(tmp_path: Path) -> None:
    root = voc_folder(tmp_path / "voc")
    (root / "VOCdevkit/VOC2012/ImageSets/Segmentation/val.txt").unlink()
    with pytest.raises(SegmentationError, match="val.txt is missing"):
        voc(root, "val")
    ade = ade_folder(tmp_path / "ade") / "ADEChallengeData2016"
    Image.new("RGB", (30, 16)).save(ade / "images" / "validation" / "ADE_valid_00000000.jpg")
    with pytest.raises(SegmentationError, match="size mismatch"):
        ade20k(ade.parent, "val")[0]
    with pytest.raises(SegmentationError, match="class-count mismatch: .* holds label value 150 .* 100 classes"):
        ade20k(ade.parent, "val", num_classes=100)[1]


@pytest.mark.slow
def test_linear_and_dense_clis_on_the_embedded_default(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=ev", "train.max_steps=2")).fit()
    ckpt = runs / "ev" / "checkpoints" / "last.pt"
    common = [f"ckpt={ckpt}", *TINY, "eval.max_train_images=48", "eval.max_val_images=16"]
    lin = run_command([sys.executable, "-m", "vitsinks.eval.linear", *common, "eval.linear_epochs=2"])
    assert lin.returncode == 0, lin.stderr
    result = json.loads((runs / "ev" / "results" / "linear.json").read_text())
    assert {c["n_last"] for c in result["grid"]} == {1, 2}  # "last 4" of a 2-block model
    assert len(result["grid"]) == 6 * 2 * 2 and result["best"]["top1"] == max(c["top1"] for c in result["grid"])
    dense = run_command([sys.executable, "-m", "vitsinks.eval.dense", *common, "eval.dense_epochs=2",
                            "eval.dense_augment=true", "eval.dense_examples=2"])
    assert dense.returncode == 0, dense.stderr
    d = json.loads((runs / "ev" / "results" / "dense_synthetic.json").read_text())
    assert d["protocol"] == "dinov2" and "dense probe (dinov2) on synthetic" in dense.stdout
    assert d["classes"] == 5 and 0 <= d["mIoU"] <= 1 and len(d["per_class_iou"]) == 5
    assert (runs / "ev" / "results" / "dense_synthetic.png").stat().st_size > 5000
    missing = run_command([sys.executable, "-m", "vitsinks.eval.dense", f"ckpt={ckpt}", "data=voc",
                              f"data.root={runs / 'nowhere'}"])
    assert missing.returncode == 1 and "does not exist" in missing.stderr


@pytest.mark.slow
def test_linear_probe_runs_on_real_fashion_mnist(runs: Path) -> None:
    require_fashion_mnist()
    Trainer(tiny_cfg(runs, "name=fm", "data=fashion_mnist", "data.image_size=32", "train.max_steps=1")).fit()
    out = run_command([sys.executable, "-m", "vitsinks.eval.linear", f"ckpt={runs / 'fm/checkpoints/last.pt'}",
                          "eval.max_train_images=200", "eval.max_val_images=100", "eval.linear_epochs=3"])
    assert out.returncode == 0, out.stderr
    result = json.loads((runs / "fm" / "results" / "linear.json").read_text())
    assert result["data"] == "fashion_mnist" and result["classes"] == 10 and result["val_images"] == 100
    assert result["best"]["top1"] > 20  # well above chance (10%) even for an untrained tiny backbone


@pytest.mark.slow
def test_dense_probe_on_fashion_mnist_mosaics(runs: Path) -> None:
    require_fashion_mnist()
    from vitsinks.data.segmentation import build_seg_dataset

    data = DataConfig(name="fashion_mnist", root="/usr/share/datasets/fashion-mnist", image_size=32, val_size=8)
    mosaics = build_seg_dataset(data, "val")
    img, lab = mosaics[3]
    again = mosaics[3]
    assert img.size == (32, 32) and np.array_equal(lab, again[1])  # deterministic per index
    gray = np.asarray(img)[..., 0]
    assert ((lab > 0) == (gray > 30)).mean() > 0.95  # item pixels are labelled, background is 0
    assert len(np.unique(lab)) >= 2 and lab.max() <= 10
    Trainer(tiny_cfg(runs, "name=fmd", "data=fashion_mnist", "data.image_size=32", "train.max_steps=1")).fit()
    out = run_command([sys.executable, "-m", "vitsinks.eval.dense", f"ckpt={runs / 'fmd/checkpoints/last.pt'}",
                          "eval.max_train_images=32", "eval.max_val_images=8", "eval.dense_epochs=1"])
    assert out.returncode == 0, out.stderr
    d = json.loads((runs / "fmd" / "results" / "dense_fashion_mnist.json").read_text())
    assert d["classes"] == 11 and d["val_images"] == 8 and 0 <= d["mIoU"] <= 1


def test_feature_caches_are_keyed_on_what_determines_them(runs: Path, tmp_path: Path) -> None:
    from vitsinks.eval import linear
    from vitsinks.probes.features import cache_key

    ckpt = trained(runs)
    linear.run(eval_cfg(runs, ckpt))
    linear.run(eval_cfg(runs, ckpt, "seed=1"))  # another seed draws other synthetic images: new features
    assert len(list((runs / "ev2" / "eval_cache").glob("lin-*.pt"))) == 4  # (train, val) x 2 seeds
    root = voc_folder(tmp_path)
    data = DataConfig(name="voc", root=str(root))
    ds = voc(root, "train")
    key = cache_key(ckpt, data, ds, 0, size=32)
    assert key == cache_key(ckpt, data, voc(root, "train"), 0, size=32)
    assert key != cache_key(ckpt, DataConfig(name="voc", root=str(root), voc_aug=True), ds, 0, size=32)
    assert key != cache_key(ckpt, data, ds, 0, size=64)
    label = root / "VOCdevkit/VOC2012/SegmentationClass/2007_000032.png"
    Image.fromarray(np.zeros((10, 20), np.uint8)).save(label)  # relabelled on disk: a new key
    assert key != cache_key(ckpt, data, voc(root, "train"), 0, size=32)


@pytest.mark.slow
def test_the_dense_probe_gives_the_same_numbers_for_the_same_command(runs: Path, figures: list) -> None:
    from vitsinks.eval import dense

    ckpt = trained(runs)
    cfg = eval_cfg(runs, ckpt, "eval.dense_examples=2")
    first = dense.run(cfg)
    axes = figures[-1].axes  # rows of image | ground truth | prediction, drawn from the validation items
    from vitsinks.probes.common import limit

    val = limit(build_seg_dataset(cfg.data, "val", cfg.seed), cfg.eval.max_val_images, cfg.selection.seed)  # its order
    assert len(axes) == 6
    for row in range(2):
        img, label = val[row]
        assert np.array_equal(axes[3 * row].images[0].get_array(), np.asarray(img))
        colours = axes[3 * row + 1].images[0].get_array().reshape(-1, 3)
        assert len(np.unique(colours, axis=0)) == len(np.unique(label))
    head = torch.load(runs / "ev2" / "results" / "dense_synthetic_head.pt")["heads"][0]
    caches = list((runs / "ev2" / "eval_cache").glob("dense-*.pt"))  # label maps cached as bytes, not int64
    assert caches and all(torch.load(c)["label"].dtype == torch.uint8 for c in caches)
    second = dense.run(eval_cfg(runs, ckpt))  # from the cache
    assert first["mIoU"] == second["mIoU"] and first["probes"][0]["train_loss"] == second["probes"][0]["train_loss"]
    again = torch.load(runs / "ev2" / "results" / "dense_synthetic_head.pt")["heads"][0]
    assert all(torch.equal(head[k], again[k]) for k in head)
    augmented = [dense.run(eval_cfg(runs, ckpt, "eval.dense_augment=true"))["mIoU"] for _ in range(2)]
    assert augmented[0] == augmented[1]


@pytest.mark.slow
def test_after_train_runs_the_dense_probe_on_other_data_or_says_why_not(runs: Path, tmp_path: Path, capsys) -> None:
    from vitsinks.run.pipeline import after_train

    require_fashion_mnist()
    cfg = tiny_cfg(runs, "name=at", "train.max_steps=1", "eval.dense_data=fashion_mnist", "eval.max_train_images=16",
                   "eval.max_val_images=8", "eval.linear_epochs=1", "eval.dense_epochs=1", "eval.linear_lrs=[0.01]")
    Trainer(cfg).fit()
    out = after_train(cfg, runs / "at")
    assert out["dense"]["data"] == "fashion_mnist" and 0 <= out["dense"]["mIoU"] <= 1
    assert json.loads((runs / "at" / "results" / "dense_fashion_mnist.json").read_text())["classes"] == 11
    root = imagefolder(tmp_path / "inet", {"a": (8, 2), "b": (8, 2)})
    cfg = tiny_cfg(runs, "name=at2", "data=imagenet", f"data.root={root}", "data.num_workers=0", "train.max_steps=1",
                   "eval.max_train_images=16", "eval.linear_epochs=1", "eval.linear_lrs=[0.01]")
    Trainer(cfg).fit()
    out = after_train(cfg, runs / "at2")
    assert "dense" not in out and "dense probe skipped: data=imagenet has no segmentation masks" in \
        capsys.readouterr().out


def test_one_bad_validation_image_does_not_lose_the_run(runs: Path, tmp_path: Path) -> None:
    root = imagefolder(tmp_path / "inet", {"a": (8, 3), "b": (8, 3)})
    (root / "val" / "a" / "0.JPEG").write_bytes(b"\xff\xd8 truncated")
    common = ["data=imagenet", f"data.root={root}", "data.num_workers=0", "train.max_steps=2",
              "diagnostics.enabled=true", "diagnostics.plots=false", "diagnostics.n_images=6"]
    summary = Trainer(tiny_cfg(runs, "name=badval", *common)).fit()
    assert summary["status"] == "finished" and (runs / "badval/checkpoints/last.pt").is_file()
    d = np.load(runs / "badval/diagnostics/step_0000002/per_image.npz")
    assert d["mass"].shape[0] == 5  # the 5 readable of the 6 validation images
    from vitsinks.data import BadImage

    with pytest.raises(BadImage, match="0.JPEG.*on_bad_image=skip"):
        Trainer(tiny_cfg(runs, "name=badval2", *common, "data.on_bad_image=error")).fit()


@pytest.mark.slow
def test_corrupt_or_mismatched_evaluation_data_gives_one_line(runs: Path, tmp_path: Path) -> None:
    ckpt = trained(runs)
    root = imagefolder(tmp_path / "inet", {"a": (4, 1), "b": (4, 1)})
    (root / "val" / "b" / "0.JPEG").unlink()
    (root / "val" / "b").rmdir()
    line = one_line_error(run_module("vitsinks.eval.linear", f"ckpt={ckpt}", "data=imagenet", f"data.root={root}"))
    assert "missing: b" in line
    (root / "val" / "b").mkdir()
    (root / "val" / "b" / "0.JPEG").write_bytes(b"garbage")
    line = one_line_error(run_module("vitsinks.eval.linear", f"ckpt={ckpt}", "data=imagenet", f"data.root={root}",
                              "data.on_bad_image=error"))
    assert "cannot decode image" in line and "0.JPEG" in line
    line = one_line_error(run_module("vitsinks.diagnose", f"ckpt={ckpt}", "data=imagenet", f"data.root={root}",
                              "data.on_bad_image=error", "n_images=4"))
    assert "cannot decode image" in line
    voc_root = voc_folder(tmp_path / "voc")
    jpeg = voc_root / "VOCdevkit/VOC2012/JPEGImages/2007_000039.jpg"
    jpeg.write_bytes(jpeg.read_bytes()[:60])  # truncated
    voc_data = ["data=voc", f"data.root={voc_root}", "data.image_size=32"]
    line = one_line_error(run_module("vitsinks.eval.dense", f"ckpt={ckpt}", *voc_data, "data.on_bad_image=error"))
    assert "2007_000039.jpg" in line
    result = dense.run(eval_cfg(runs, ckpt, *voc_data))  # skipped under the default policy
    assert result["val_images"] == 2 and 0 <= result["mIoU"] <= 1


# Dense-probe protocols: dinov2 (BatchNorm + 1x1 conv, sliding window) and the reference's kempner / kempner_cached.


def test_a_torn_feature_cache_is_computed_again(runs: Path, capsys) -> None:
    from vitsinks.eval import linear

    ckpt = trained(runs)
    first = linear.run(eval_cfg(runs, ckpt))
    caches = sorted((runs / "ev2" / "eval_cache").glob("lin-*.pt"))
    for cache in caches:
        cache.write_bytes(cache.read_bytes()[:200])  # torn behind vitsinks' back (a copy cut short, a bad disk)
    capsys.readouterr()
    again = linear.run(eval_cfg(runs, ckpt))
    assert capsys.readouterr().out.count("is torn or not one vitsinks wrote") == len(caches) == 2
    assert again["best"] == first["best"]
    assert all(torch.load(c)["index"].numel() > 0 for c in caches)  # whole again


def test_a_feature_cache_that_would_run_code_is_never_unpickled_and_is_computed_again(runs: Path, capsys) -> None:
    from tests.helpers.malicious import plant
    from vitsinks.eval import linear

    ckpt = trained(runs)
    first = linear.run(eval_cfg(runs, ckpt))
    caches = sorted((runs / "ev2" / "eval_cache").glob("lin-*.pt"))
    marker = runs / "ran"
    for cache in caches:
        plant(cache, marker)  # a planted cache file: its pickle runs a command
    capsys.readouterr()
    again = linear.run(eval_cfg(runs, ckpt))
    assert not marker.exists()
    assert capsys.readouterr().out.count("is torn or not one vitsinks wrote") == len(caches) == 2
    assert again["best"] == first["best"]
