"""The dense-probe protocols (`vitsinks.probes.dense_protocols`): the reference's linear probe at 512 px and its cached
Table-1 variant, against their schedule written out, hand-made curves and the on-disk fixtures of test_eval."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.datasets import ade_folder, voc_folder
from tests.helpers.tiny import eval_cfg, tiny_vit, trained
from vitsinks.configs.schema import DataConfig
from vitsinks.data.segmentation import IGNORE, build_seg_dataset
from vitsinks.probes.dense_head import DenseHead
from vitsinks.probes.dense_protocols import DENSE_PROTOCOLS
from vitsinks.probes.metrics import iou_from_confusion


def _lrs(make_scheduler, lr: float, total: int) -> list[float]:
    """The learning rate of each of `total` iterations under `make_scheduler(optimizer)`."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched, seen = make_scheduler(opt), []
    for _ in range(total):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


def test_warmup_cosine_schedule_matches_its_formula_and_the_reference_construction() -> None:
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    from vitsinks.probes.dense_protocols import scheduler

    lr, total = 5e-3, 1100
    ours = _lrs(lambda opt: scheduler(opt, total, DENSE_PROTOCOLS["kempner"]), lr, total)
    # by hand: linear from 0.01 lr over 100 iterations, then cosine from lr to lr / 100 over the remaining 1000
    assert ours[0] == pytest.approx(lr * 0.01)
    assert ours[50] == pytest.approx(lr * (0.01 + 0.99 * 50 / 100))
    assert ours[100] == pytest.approx(lr)
    assert ours[600] == pytest.approx(lr * (0.01 + 0.99 * 0.5))  # half-way through the cosine
    assert ours[1099] == pytest.approx(lr * (0.01 + 0.99 * (1 + math.cos(math.pi * 999 / 1000)) / 2))
    # the reference's own construction with torch's schedulers: the same learning rate at every iteration
    theirs = _lrs(lambda opt: SequentialLR(opt, [LinearLR(opt, start_factor=0.01, end_factor=1.0, total_iters=100),
                                                 CosineAnnealingLR(opt, T_max=total - 100, eta_min=lr / 100)],
                                           milestones=[100]), lr, total)
    assert ours == pytest.approx(theirs, rel=1e-9)
    seen = _lrs(lambda opt: scheduler(opt, 10, DENSE_PROTOCOLS["dinov2"]), 1.0, 10)  # dinov2: cosine to 0, no warm-up
    assert seen[0] == 1.0 and seen[5] == pytest.approx(0.5)
    assert seen[9] == pytest.approx((1 + math.cos(0.9 * math.pi)) / 2)


def test_the_reported_number_is_the_best_val_epoch_the_one_before_training_included() -> None:
    from vitsinks.probes.dense_head import fit
    from vitsinks.probes.dense_protocols import best_epoch

    assert best_epoch([0.3, 0.1, 0.3, 0.2]) == 0 and best_epoch([math.nan, 0.1, 0.4]) == 2
    assert best_epoch([math.nan]) == 0
    g = torch.Generator().manual_seed(0)
    feats, labels = torch.randn(4, 8, 2, 2, generator=g), torch.randint(0, 3, (4, 4, 4), generator=g)
    proto = replace(DENSE_PROTOCOLS["kempner"], epochs=3, batch_size=2, warmup_iters=2)
    for curve, best in (([0.6, 0.2, 0.4, 0.5], 0), ([0.1, 0.5, 0.3, 0.5], 1)):
        torch.manual_seed(0)
        head, snapshots = DenseHead(8, 3, batchnorm=False), []

        def fake_eval(h: DenseHead, curve: list[float] = curve, snapshots: list = snapshots) -> dict:
            snapshots.append({k: v.clone() for k, v in h.state_dict().items()})
            m = curve[len(snapshots) - 1]
            return {"mIoU": m, "pixel_acc": m, "per_class_iou": [m] * 3, "confusion": [[0] * 3] * 3}

        out = fit(head, lambda idx: (feats[idx], labels[idx]), 4, proto, 0, fake_eval)
        assert out["val_mIoU"] == curve and len(snapshots) == proto.epochs + 1  # before training + after each epoch
        assert out["mIoU"] == max(curve) and out["best_epoch"] == best
        assert all(torch.equal(head.state_dict()[k], snapshots[best][k]) for k in snapshots[best])  # best weights kept
        assert not torch.equal(snapshots[0]["conv.weight"], snapshots[-1]["conv.weight"])  # it did train
    once = []
    fit(DenseHead(8, 3), lambda idx: (feats[idx], labels[idx]), 4, replace(DENSE_PROTOCOLS["dinov2"], epochs=2),
        0, lambda h: once.append(1) or {"mIoU": 0.5, "pixel_acc": 0.5, "per_class_iou": [], "confusion": []})
    assert once == [1]  # dinov2: evaluated once, at the end


def test_a_linear_head_without_batchnorm_is_a_linear_layer_on_every_patch_token() -> None:
    torch.manual_seed(0)
    head, tokens = DenseHead(6, 4, batchnorm=False), torch.randn(2, 3 * 5, 6)  # (B, patches, D), a 3 x 5 grid
    linear = torch.nn.Linear(6, 4)
    with torch.no_grad():
        linear.weight.copy_(head.conv.weight[:, :, 0, 0])
        linear.bias.copy_(head.conv.bias)
    expect = linear(tokens).transpose(1, 2).reshape(2, 4, 3, 5)
    got = head(tokens.transpose(1, 2).reshape(2, 6, 3, 5), (3, 5))  # upsampling to its own size: the identity
    assert torch.allclose(got, expect, atol=1e-6)


def test_labels_are_resized_with_nearest_to_the_eval_size_and_keep_ignore() -> None:
    from vitsinks.data.segmentation import resize_label

    label = (np.arange(8 * 16).reshape(8, 16) % 200).astype(np.uint8)
    label[2, :] = IGNORE
    out = resize_label(label, 32)  # 32 x 32 from 8 rows x 16 columns: each row 4 times, each column twice
    assert out.dtype == torch.int64 and out.shape == (32, 32)
    assert np.array_equal(out.numpy(), np.repeat(np.repeat(label, 4, axis=0), 2, axis=1))
    assert (out[8:12] == IGNORE).all()


def test_the_joint_crop_and_flip_keep_image_and_labels_aligned() -> None:
    from lightly.transforms.utils import IMAGENET_NORMALIZE

    from vitsinks.data.segmentation import JointCropFlip

    W, H = 64, 48
    xs, ys = np.meshgrid(np.arange(W), np.arange(H))
    img = Image.fromarray(np.stack([xs * 3, ys * 3, np.zeros_like(xs)], -1).astype(np.uint8))  # pixel = 3 x (x, y)
    p = DENSE_PROTOCOLS["kempner"]
    crop = JointCropFlip(32, p.crop_scale, p.crop_ratio)
    mean = torch.tensor(IMAGENET_NORMALIZE["mean"])[:, None, None]
    std = torch.tensor(IMAGENET_NORMALIZE["std"])[:, None, None]
    flipped = 0
    for seed in range(20):
        torch.manual_seed(seed)
        x, col = crop(img, xs.astype(np.uint8))  # labels = the column ...
        torch.manual_seed(seed)
        _, row = crop(img, ys.astype(np.uint8))  # ... or the row each pixel came from
        coords = (x * std + mean) * 255 / 3  # the image's own record of where each pixel came from
        assert x.shape == (3, 32, 32) and col.shape == (32, 32) and col.dtype == torch.int64
        assert (coords[0] - col).abs().max() < 2 and (coords[1] - row).abs().max() < 2
        area = float((col.max() - col.min() + 1) * (row.max() - row.min() + 1)) / (W * H)
        assert 0.42 < area <= 1.0  # crop scale 0.5-1 of the image (the sampled span is a bit short of the crop)
        flipped += int(col[0, 0] > col[0, -1])
    assert 0 < flipped < 20  # both flipped and unflipped views were checked


def test_voc_background_is_ignored_under_the_kempner_protocols(tmp_path: Path) -> None:
    from vitsinks.data.segmentation import ignore_background

    assert ignore_background(np.array([[0, 1, 20, 255]], np.uint8)).tolist() == [[255, 0, 19, 255]]
    root = voc_folder(tmp_path)
    cfg = DataConfig(name="voc", root=str(root), num_classes=21)
    assert not DENSE_PROTOCOLS["kempner_cached"].voc_background and not DENSE_PROTOCOLS["kempner"].voc_background
    assert DENSE_PROTOCOLS["dinov2"].voc_background
    ds = build_seg_dataset(cfg, "val", voc_background=False)
    _, lab = ds[1]
    assert ds.num_classes == 20 and lab[5, 10] == 0 and lab[0, 0] == IGNORE and (lab[1] == IGNORE).all()
    assert build_seg_dataset(cfg, "val").num_classes == 21


def _resized_label_pixels(ds, size: int) -> int:
    from vitsinks.data.segmentation import resize_label

    return sum(int((resize_label(ds[i][1], size) != IGNORE).sum()) for i in range(len(ds)))


def test_kempner_protocol_end_to_end_writes_its_protocol(runs: Path, tmp_path: Path, capsys) -> None:
    from vitsinks.eval import dense

    ckpt = trained(runs, "kp", "model.registers=1")
    root = ade_folder(tmp_path)
    cfg = eval_cfg(runs, ckpt, "data=ade20k", f"data.root={root}", "data.num_classes=150",
                    "eval.dense_protocol=kempner", "eval.dense_size=48", "eval.dense_examples=1")  # 32 px model
    result = dense.run(cfg)
    path = runs / "kp" / "results" / "dense_ade20k_kempner.json"
    d = json.loads(path.read_text())
    assert d["protocol"] == "kempner" and d["overrides"] == {"size": 48, "epochs": 2}
    s = d["protocol_settings"]
    assert s["size"] == 48 and s["lr"] == 5e-3 and s["batch_size"] == 32 and s["augment"] and not s["batchnorm"]
    assert s["crop_scale"] == [0.5, 1.0] and s["val"] == "resize" and s["miou_classes"] == "all"
    probe = d["probes"][0]
    assert len(probe["val_mIoU"]) == 3 and d["mIoU"] == max(probe["val_mIoU"]) == result["mIoU"]
    assert d["classes"] == 150 and d["mIoU"] == pytest.approx(sum(d["per_class_iou"]) / 150)  # absent classes: 0
    val = build_seg_dataset(cfg.data, "val")
    assert np.sum(probe["confusion"]) == _resized_label_pixels(val, 48)  # val at 48 x 48, not the labels' 24 x 16
    assert "dense probe (kempner) on ade20k" in capsys.readouterr().out
    assert torch.load(runs / "kp" / "results" / "dense_ade20k_kempner_head.pt")["protocol"] == "kempner"
    assert (runs / "kp" / "results" / "dense_ade20k_kempner.png").is_file()


def test_kempner_cached_protocol_end_to_end_reports_three_probe_seeds(runs: Path, tmp_path: Path) -> None:
    from vitsinks.eval import dense

    ckpt = trained(runs, "kc")
    root = voc_folder(tmp_path)
    d = dense.run(eval_cfg(runs, ckpt, "data=voc", f"data.root={root}", "data.num_classes=21",
                            "eval.dense_protocol=kempner_cached",
                            "eval.dense_size=32", "eval.dense_examples=0", "seed=5"))
    assert json.loads((runs / "kc" / "results" / "dense_voc_kempner_cached.json").read_text())["mIoU"] == d["mIoU"]
    assert d["protocol"] == "kempner_cached" and not d["protocol_settings"]["augment"]
    assert d["overrides"] == {"size": 32, "epochs": 2}  # the reference: 512 px, VOC 100 epochs
    assert d["classes"] == 20 and len(d["per_class_iou"]) == 20  # VOC background ignored
    assert [p["seed"] for p in d["probes"]] == [5, 6, 7]
    best = [p["mIoU"] for p in d["probes"]]
    assert d["mIoU"] == pytest.approx(np.mean(best)) and d["mIoU_std"] == pytest.approx(np.std(best))
    assert all(p["mIoU"] == max(p["val_mIoU"]) and len(p["val_mIoU"]) == 3 for p in d["probes"])


def test_dense_protocol_bad_input_gives_a_config_error() -> None:
    from vitsinks.configs.cli import compose
    from vitsinks.probes.dense_head import check_size
    from vitsinks.probes.dense_protocols import resolve
    from vitsinks.utils.errors import ConfigError

    with pytest.raises(ConfigError, match="dense_protocol.*mmseg"):
        compose(["eval.dense_protocol=mmseg"])
    e = compose(["eval.dense_protocol=kempner", "eval.dense_lr=0.01"]).eval
    with pytest.raises(ConfigError, match=r"eval.dense_lr=0.01: eval.dense_protocol=kempner fixes lr 0.005"):
        resolve(e, "ade20k")
    with pytest.raises(ConfigError, match="dense_size"):
        compose(["eval.dense_size=0"])
    proto, changed = resolve(compose(["eval.dense_protocol=kempner_cached"]).eval, "voc")
    assert proto.epochs == 100 and proto.size == 512 and proto.probe_seeds == 3 and changed == {}
    assert resolve(compose(["eval.dense_protocol=kempner"]).eval, "ade20k")[0].epochs == 10
    assert resolve(compose(["eval.dense_protocol=kempner"]).eval, "voc")[0].epochs == 25
    model = tiny_vit(depth=1)  # patch 8
    with pytest.raises(ConfigError, match="dense_size=36 is not a multiple of the model's patch size 8"):
        check_size(model, 36)
    with pytest.raises(ConfigError, match="only takes 32 px"):
        check_size(tiny_vit(depth=1, dynamic_img_size=False), 48)


def test_miou_over_all_classes_counts_an_absent_class_as_zero() -> None:
    conf = torch.tensor([[5, 1, 0], [2, 3, 0], [0, 0, 0]])  # as above: class 2 in neither labels nor predictions
    r = iou_from_confusion(conf, "all")
    assert r["per_class_iou"] == [5 / 8, 0.5, 0.0] and r["mIoU"] == pytest.approx((5 / 8 + 0.5 + 0) / 3)
    assert r["pixel_acc"] == pytest.approx(8 / 11)
