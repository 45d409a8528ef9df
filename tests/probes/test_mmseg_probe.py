"""`python -m vitsinks.eval.dense ... eval.dense_backend=mmseg` as a user runs it, on ADE20K and VOC in their official
layouts: mmseg's per-class table and mIoU printed, the result written as the native probe's with its backend, a
leaderboard column of its own; settings it cannot take end in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.commands import one_line_error, run_module
from tests.helpers.datasets import ade_folder, voc_folder
from tests.helpers.requirements import require
from tests.helpers.tiny import TINY, eval_cfg, trained
from vitsinks.probes.mmseg_config import COMMAND_NAMES
from vitsinks.probes.probe_results import DenseResult, dense_column, dense_kind, parse_dense_kind, reprobe
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import RunDir

require("mmseg")


@pytest.mark.slow
@pytest.mark.parametrize("data", ["ade20k", "voc"])
def test_the_dense_probe_by_mmseg_on_the_official_layouts(runs: Path, tmp_path: Path, data: str) -> None:
    ckpt = trained(runs)
    root = ade_folder(tmp_path) if data == "ade20k" else voc_folder(tmp_path)
    classes = 150 if data == "ade20k" else 21
    out = run_module("vitsinks.eval.dense", f"ckpt={ckpt}", *TINY, f"data={data}", f"data.root={root}",
                     f"data.num_classes={classes}", "eval.dense_backend=mmseg", "eval.dense_epochs=2")
    assert out.returncode == 0, out.stderr
    assert "per class results:" in out.stdout  # mmseg's own table, its classes by name
    assert re.search(r"\|\s+Class\s+\|\s+IoU\s+\|\s+Acc\s+\|", out.stdout)
    assert re.search(r"\|\s+wall\s+\|" if data == "ade20k" else r"\|\s+background\s+\|", out.stdout)
    run = RunDir(runs / "ev2")
    result = json.loads(run.result(f"dense_{data}_mmseg").read_text())
    assert f"dense probe (dinov2, mmseg linear) on {data}: mIoU {result['mIoU'] * 100:.2f}" in out.stdout
    assert (result["protocol"], result["backend"], result["classes"]) == ("dinov2", "mmseg", classes)
    assert set(result["settings"]) == set(COMMAND_NAMES) and result["settings"]["size"] == 32
    assert len(result["per_class_iou"]) == len(result["class_names"]) == classes
    assert result["mmseg_metrics"]["mIoU"] == round(100 * result["mIoU"], 2)  # what mmseg printed
    assert result["val_images"] == 2 and result["train_images"] == (2 if data == "ade20k" else 1)
    assert (run.results / f"dense_{data}_mmseg_head.pt").is_file() and list((run.results / f"dense_{data}_mmseg")
                                                                           .glob("*/*.log"))
    collected = DenseResult.collect(run)
    assert collected[f"dense_{data}_mmseg"] == 100 * result["mIoU"]
    (column,) = DenseResult.extra_columns({f"dense_{data}_mmseg"})
    assert column.label.endswith("mIoU (DINOv2-style probe, mmseg)") and column.probe == "dense probe (dinov2, mmseg)"
    assert "eval.dense_backend=mmseg" in reprobe(run, f"dense_{data}_mmseg")


@pytest.mark.slow
def test_the_same_command_gives_the_same_numbers(runs: Path, tmp_path: Path) -> None:
    from vitsinks.eval import dense

    ckpt = trained(runs)
    cfg = eval_cfg(runs, ckpt, "data=voc", f"data.root={voc_folder(tmp_path)}", "data.num_classes=21",
                   "eval.dense_backend=mmseg", "eval.dense_mmseg_config=linear_multilayer")
    first, second = dense.run(cfg), dense.run(cfg)
    assert first["mIoU"] == second["mIoU"] and first["per_class_iou"] == second["per_class_iou"]
    assert first["mmseg_config"] == "linear_multilayer"


@pytest.mark.slow
def test_what_the_mmseg_backend_cannot_take_ends_in_one_line(runs: Path, tmp_path: Path) -> None:
    ckpt = trained(runs)
    voc = ["data=voc", f"data.root={voc_folder(tmp_path)}", "data.num_classes=21"]
    cases = [(["data=synthetic"], "reads data=ade20k or data=voc with mmseg's own datasets, not data=synthetic"),
             ([*voc, "eval.dense_protocol=kempner"], "trains under eval.dense_protocol=dinov2 .* not "
                                                     "eval.dense_protocol=kempner"),
             ([*voc, "eval.dense_augment=true"], "without eval.dense_augment.* eval.dense_augment=True"),
             ([*voc, "eval.dense_mmseg_config=nope"], "no mmseg/nope_voc.py .* choose one of linear, "
                                                      "linear_multilayer, upernet"),
             ([*voc[:2], "data.num_classes=20"], "mmseg's PascalVOCDataset has 21 classes, the data config 20")]
    for overrides, says in cases:
        line = one_line_error(run_module("vitsinks.eval.dense", f"ckpt={ckpt}", *TINY, *overrides,
                                         "eval.dense_backend=mmseg"))
        assert re.search(says, line), line
    assert not (runs / "ev2" / "results" / "dense_voc_mmseg.json").exists()


def test_the_backend_is_part_of_a_dense_results_kind_and_column(tmp_path: Path) -> None:
    kinds = {"dense_ade20k": ("ade20k", "dinov2", "native"), "dense_voc_kempner": ("voc", "kempner", "native"),
             "dense_ade20k_mmseg": ("ade20k", "dinov2", "mmseg"),
             "dense_fashion_mnist_kempner_cached": ("fashion_mnist", "kempner_cached", "native")}
    for kind, parts in kinds.items():
        assert parse_dense_kind(kind) == parts and dense_kind(*parts) == kind
    native = DenseResult(0.5, "dinov2", {"data": "voc"})
    assert "backend" not in native.to_json()  # the native probe's files are what they were
    by_mmseg = DenseResult(0.5, "dinov2", {"data": "voc"}, backend="mmseg").to_json()
    assert list(by_mmseg) == ["data", "protocol", "backend", "mIoU"]
    assert DenseResult.from_json(by_mmseg).backend == "mmseg"
    assert dense_column("voc", "dinov2", "mmseg").key != dense_column("voc", "dinov2").key
    run = RunDir(tmp_path / "run")
    run.results.mkdir(parents=True)
    run.result("dense_voc").write_text(json.dumps(by_mmseg))  # an mmseg result under the native probe's name
    with pytest.raises(BadValue, match="dinov2 dense protocol \\(mmseg backend\\), not dinov2 \\(native\\)"):
        DenseResult.collect(run)


@pytest.mark.slow
def test_a_hub_model_is_probed_by_mmseg_through_the_seam(tmp_path: Path) -> None:
    require("transformers")
    from tests.helpers.saved_models import model_alone

    model_alone(tmp_path / "dino", "dinov2")  # a tiny transformers DINOv2 (2 blocks, 32 px), saved alone
    out = run_module("vitsinks.eval.dense", f"hub=hf:{tmp_path / 'dino'}", f"runs_dir={tmp_path / 'runs'}", "data=voc",
                     f"data.root={voc_folder(tmp_path)}", "data.num_workers=0", "eval.dense_backend=mmseg",
                     "eval.dense_epochs=1")
    assert out.returncode == 0, out.stderr
    (path,) = (tmp_path / "runs").rglob("dense_voc_mmseg.json")
    result = json.loads(path.read_text())
    assert result["backend"] == "mmseg" and result["settings"]["size"] == 32 and 0 <= result["mIoU"] <= 1
    assert "per class results:" in out.stdout
