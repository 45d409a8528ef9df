"""Diagnostics at every checkpoint, the over-training picture, the CLI, and pretrained timm weights."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from tests.helpers.commands import run_command
from tests.helpers.tiny import TINY, tiny_cfg
from vitsinks.intervene import output_dir
from vitsinks.models import model_from_config
from vitsinks.quantize import quantize
from vitsinks.run.diagnosed import diagnose_checkpoint, over_training
from vitsinks.run.source import for_probes
from vitsinks.train.checkpoint import load_backbone
from vitsinks.train.trainer import Trainer
from vitsinks.utils.plotting import CLASS_LABELS

PLOTS = {"attention_maps.png", "nop_broadcast_scatter.png", "sink_heatmap.png", "sink_location_by_block.png",
         "massive_activations.png"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", "vitsinks.diagnose", *args])


@pytest.mark.slow
def test_training_diagnoses_every_checkpoint_and_run_draws_the_over_training_picture(runs: Path,
                                                                                     figures: list) -> None:
    cfg = tiny_cfg(runs, "name=diag", "diagnostics.enabled=true", "diagnostics.n_images=6")
    Trainer(cfg).fit()
    diag = runs / "diag" / "diagnostics"
    # periodic checkpoints (3, 6), the end of epoch 0 (4) and the end (8)
    assert sorted(p.name for p in diag.iterdir()) == ["step_0000003", "step_0000004", "step_0000006", "step_0000008"]
    for d in diag.iterdir():
        assert PLOTS <= {p.name for p in d.iterdir()}
        arrays = np.load(d / "per_image.npz")
        assert arrays["mass"].shape == (6, 2, 3) and arrays["recompute_error"].max() < 1e-5
        assert json.loads((d / "summary.json").read_text())["shape"]["images"] == 6
    # the diagnostics are a pure function of the checkpoint: recomputing step 6 from its file gives the same summary
    again = diagnose_checkpoint(runs / "diag/checkpoints/step_0000006.pt", cfg, out_dir=runs / "again")
    assert again == json.loads((diag / "step_0000006" / "summary.json").read_text())

    (diag / "step_0000006" / "summary.json").unlink()  # a checkpoint whose diagnostics are missing is redone
    out = cli(f"run={runs / 'diag'}", *TINY, f"runs_dir={runs}", "n_images=6")
    assert out.returncode == 0, out.stderr
    assert (diag / "over_training.png").stat().st_size > 10_000
    rows = list(csv.DictReader((diag / "over_training.csv").open()))
    assert [int(r["step"]) for r in rows] == [3, 4, 6, 8]
    assert json.loads((diag / "step_0000006" / "summary.json").read_text()) == again
    rows = over_training(runs / "diag", cfg)  # the picture draws the summaries' numbers
    curves, frequency = figures[-1].axes[:2]
    for line, name in zip(curves.lines, ("nop", "broadcast", "unclassified"), strict=False):
        assert line.get_label() == CLASS_LABELS[name] and list(line.get_xdata()) == [3, 4, 6, 8]
        assert list(line.get_ydata()) == [r["sinks_per_image"][name]["all"] for _, r in rows]
    freq = np.array([r["block_frequency"] for _, r in rows]).T
    if freq.any():  # the map draws the frequencies; without any event it says so instead of drawing black
        np.testing.assert_array_equal(frequency.images[0].get_array(), freq)
    else:
        assert not frequency.images and "no sink event" in " ".join(t.get_text() for t in frequency.texts)


@pytest.mark.slow
def test_cli_on_a_checkpoint_with_other_data_and_n_images(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=c", "train.max_steps=2")).fit()
    ckpt = runs / "c/checkpoints/last.pt"
    out = cli(f"ckpt={ckpt}", "data=synthetic", "data.image_size=48", "data.num_classes=3", "n_images=4",
              "diagnostics.plots=false")
    assert out.returncode == 0, out.stderr
    arrays = np.load(runs / "c/diagnostics/last/per_image.npz")
    assert arrays["mass"].shape == (4, 2, 3)
    missing = cli(f"ckpt={runs / 'nope.pt'}")
    assert missing.returncode == 1 and "nope.pt not found" in missing.stderr


def test_checkpoint_backbone_round_trip(runs: Path) -> None:
    trainer = Trainer(tiny_cfg(runs, "name=rt", "train.max_steps=1"))
    trainer.fit()
    model, cfg = load_backbone(runs / "rt/checkpoints/last.pt")
    x = torch.randn(2, 3, 32, 32)
    trainer.model.eval()
    torch.testing.assert_close(model.eval()(x), trainer.model.backbone(x))
    assert cfg.model.depth == 2


def test_a_loose_checkpoint_files_analyses_go_under_the_runs_folder_by_its_name(runs: Path, tmp_path: Path) -> None:
    Trainer(tiny_cfg(runs, "name=l", "train.max_steps=1", "diagnostics.enabled=false")).fit()
    loose = tmp_path / "downloads" / "model.pt"  # a copy outside any run's checkpoints/ folder
    loose.parent.mkdir()
    shutil.copy(runs / "l/checkpoints/last.pt", loose)
    elsewhere = tmp_path / "elsewhere"
    cfg = tiny_cfg(elsewhere, f"ckpt={loose}", "diagnostics.n_images=4", "diagnostics.plots=false",
                   "quant.n_images=4", "quant.calib_images=4", "quant.probes=false")
    assert output_dir(cfg) == elsewhere / "interventions" / "model"
    assert for_probes(cfg).results().path == elsewhere / "quant" / "model"  # the probes' results: quantize reads them
    _, quant = quantize(cfg)
    assert quant == elsewhere / "quant" / "model" / "results" / "quant.json"
    diagnose_checkpoint(loose, cfg)
    page = json.loads((elsewhere / "diagnostics" / "model" / "report.json").read_text())
    assert page["quant"]["checkpoint"] == "model.pt"  # this file's W8A8 result, found by its record
    assert page["checkpoint"] == "model"  # the page is titled by its folder, not by the staging folder it was built in
    assert not [p for p in tmp_path.iterdir() if p.name not in ("runs", "downloads", "elsewhere")]  # none beside it
    other = tmp_path / "other" / "model.pt"  # another file of that name: its page shows no foreign W8A8 result
    other.parent.mkdir()
    shutil.copy(loose, other)
    diagnose_checkpoint(other, tiny_cfg(tmp_path / "third", "diagnostics.n_images=4", "diagnostics.plots=false"))
    assert json.loads((tmp_path / "third" / "diagnostics" / "model" / "report.json").read_text())["quant"] is None
    # in a run: last.pt's W8A8 result is on last.pt's page, not on another checkpoint's of the run
    last, step = runs / "l/checkpoints/last.pt", runs / "l/checkpoints/step_0000001.pt"
    shutil.copy(last, step)
    quantize(tiny_cfg(runs, f"ckpt={last}", "quant.n_images=4", "quant.calib_images=4", "quant.probes=false"))
    for ckpt, shown in ((last, "l/checkpoints/last.pt"), (step, None)):
        diagnose_checkpoint(ckpt, tiny_cfg(runs, "diagnostics.n_images=4", "diagnostics.plots=false"))
        page = json.loads((runs / "l/diagnostics" / ckpt.stem / "report.json").read_text())
        assert (page["quant"] or {}).get("checkpoint") == shown


@pytest.mark.slow
def test_pretrained_timm_state_dict_is_loaded_and_diagnosed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=0,
                            reg_tokens=4, no_embed_class=True, init_values=1e-5).eval()  # DINOv2-reg layout
    path = tmp_path / "dinov2_like.pth"
    torch.save(ref.state_dict(), path)
    cfg = tiny_cfg(tmp_path, "exp=reg", f"model.pretrained={path}", "model.layerscale_init=1e-5")
    model = model_from_config(cfg.model).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=1e-5)
    out = cli(*TINY, "exp=reg", f"model.pretrained={path}", "model.layerscale_init=1e-5", f"runs_dir={tmp_path}",
              "n_images=3", "diagnostics.plots=false")
    assert out.returncode == 0, out.stderr
    # imported as a run named by the file (as every command names it); its analyses sit in that run
    written = tmp_path / "dinov2_like" / "diagnostics" / "last" / "summary.json"
    summary = json.loads(written.read_text())
    assert summary["shape"] == {"images": 3, "blocks": 2, "heads": 3, "registers": 4}
    other = tmp_path / "elsewhere" / "dinov2_like.pth"  # another model under the same name: refused, nothing lost
    other.parent.mkdir()
    torch.save({k: v + 1 for k, v in ref.state_dict().items()}, other)
    before = written.read_bytes()
    out = cli(*TINY, "exp=reg", f"model.pretrained={other}", "model.layerscale_init=1e-5", f"runs_dir={tmp_path}",
              "n_images=3", "diagnostics.plots=false")
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"holds the import of {path.resolve()}" in out.stderr and "runs_dir=" in out.stderr
    assert written.read_bytes() == before


@pytest.mark.slow
def test_a_folder_without_checkpoints_fails_with_one_line_and_no_progress_bar(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = cli(f"run={tmp_path / 'empty'}")
    assert out.returncode == 1 and "no diagnostics and no checkpoints" in out.stderr
    assert "diagnosing checkpoints" not in out.stderr + out.stdout and len(out.stderr.strip().splitlines()) == 1


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[-1].startswith("error: "), lines
    return lines[-1]


def test_torn_files_are_one_line_or_computed_again(runs: Path) -> None:
    cfg = tiny_cfg(runs, "name=torn", "diagnostics.enabled=true", "diagnostics.n_images=4", "diagnostics.plots=false",
                   "diagnostics.report=false", "train.epochs=1")  # 4 steps: diagnoses of steps 3 and 4
    Trainer(cfg).fit()
    run = runs / "torn"
    step3 = run / "diagnostics" / "step_0000003" / "summary.json"
    whole = json.loads(step3.read_text())
    step3.write_text(step3.read_text()[:100])  # torn by a full disk, say
    out = cli(f"run={run}", *TINY, f"runs_dir={runs}", "n_images=4", "diagnostics.plots=false")
    assert out.returncode == 0, out.stderr
    assert "is torn: diagnosing its checkpoint again" in out.stdout
    assert json.loads(step3.read_text()) == whole  # the same diagnosis, from checkpoints/step_0000003.pt

    (run / "checkpoints" / "step_0000003.pt").unlink()  # torn, and its checkpoint gone: named, with the way out
    step3.write_text("{")
    line = _one_error_line(cli(f"run={run}", *TINY, f"runs_dir={runs}", "n_images=4"))
    assert str(step3) in line and "is torn" in line and f"delete {step3.parent}" in line

    quant = run / "results" / "quant.json"  # a torn quantization result, read for the page's panel
    quant.parent.mkdir(exist_ok=True)
    quant.write_text('{"checkpoint": "last.pt", "weight_bi')
    line = _one_error_line(cli(f"ckpt={run / 'checkpoints' / 'last.pt'}", *TINY, f"runs_dir={runs}", "n_images=4"))
    assert str(quant) in line and "rerun `python -m vitsinks.quantize" in line


def test_a_diagnosis_leaves_no_file_of_an_older_one(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=gen", "train.max_steps=1")).fit()
    ckpt = runs / "gen" / "checkpoints" / "last.pt"
    folder = runs / "gen" / "diagnostics" / "last"
    first = cli(f"ckpt={ckpt}", *TINY, f"runs_dir={runs}", "n_images=8", "diagnostics.plots=false")
    assert first.returncode == 0, first.stderr
    assert (folder / "report.html").is_file() and json.loads((folder / "summary.json").read_text())[
        "shape"]["images"] == 8
    second = cli(f"ckpt={ckpt}", *TINY, f"runs_dir={runs}", "n_images=4", "diagnostics.report=false")
    assert second.returncode == 0, second.stderr
    names = {p.name for p in folder.iterdir()}
    assert "report.html" not in names and "report.json" not in names  # the page of the 8 images is gone
    assert PLOTS <= names and json.loads((folder / "summary.json").read_text())["shape"]["images"] == 4
    assert np.load(folder / "per_image.npz")["mass"].shape[0] == 4
