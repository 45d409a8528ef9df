"""`python -m vitsinks.quantize` end to end on a tiny checkpoint; bad input and non-finite models."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

import vitsinks.quant  # noqa: F401 - registers the w8a8 edit (the checkpoint loader reads derived runs with it)
from tests.helpers.commands import run_module
from tests.helpers.tiny import TINY, tiny_cfg, tiny_vit
from vitsinks.posthoc import reapply
from vitsinks.quant.quant_results import QuantResult
from vitsinks.quant.w8a8 import scale_of
from vitsinks.quantize import cli, probe_changes, probe_eval, quantize
from vitsinks.train.checkpoint import load_backbone
from vitsinks.train.trainer import Trainer
from vitsinks.utils.errors import BadValue, NonFinite
from vitsinks.utils.metrics_log import read_metrics
from vitsinks.utils.rundir import RunDir, find_runs

KEYS = ["checkpoint", "weight_bits", "act_bits", "calib_images", "n_images", "by_block", "feature_cosine",
        "feature_cosine_by_block", "online_top1", "linear_top1", "dense"]
EVAL = ["eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1", "eval.linear_lrs=[0.01]",
        "eval.dense_epochs=1"]
FAST = ["diagnostics.n_images=4", "diagnostics.plots=false", "diagnostics.report=false"]


@pytest.mark.slow
def test_quantize_end_to_end_on_a_tiny_checkpoint(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=q", "seed=1", "train.max_steps=1", *EVAL)).fit()
    ckpt = runs / "q" / "checkpoints" / "last.pt"
    for probe in ("vitsinks.eval.linear", "vitsinks.eval.dense"):  # as a user runs them: no seed= given
        done = run_module(probe, f"ckpt={ckpt}", f"runs_dir={runs}", *TINY, *EVAL)
        assert done.returncode == 0, done.stderr
    out = run_module("vitsinks.quantize", f"ckpt={ckpt}", f"runs_dir={runs}", "calib_images=8", "n_images=8",
                     *FAST)
    assert out.returncode == 0, out.stderr
    run = RunDir(runs / "q")
    obj = json.loads(run.result("quant").read_text())
    assert list(obj) == KEYS and obj["checkpoint"] == str(ckpt)
    assert (obj["weight_bits"], obj["act_bits"], obj["calib_images"], obj["n_images"]) == (8, 8, 8, 8)
    assert set(obj["by_block"]) == {"kurtosis", "inf_norm"}
    for stat in obj["by_block"].values():
        assert set(stat) == {"qkv", "proj", "fc1", "fc2"}
        assert all(len(v) == 2 and all(math.isfinite(x) and x > 0 for x in v) for v in stat.values())
    assert len(obj["feature_cosine_by_block"]) == 2 and 0.9 < obj["feature_cosine"] <= 1 + 1e-9

    # the online probe on the float features is the run's own last validation
    logged = [m["val/probe_acc"] for m in read_metrics(run.path) if "val/probe_acc" in m]
    assert obj["online_top1"]["fp32"] == pytest.approx(100 * logged[-1])
    # the probes: the source's own results against the quantized run's, on the same images
    derived = RunDir(run.path / "quant" / "w8a8")
    src_lin, q_lin = (json.loads(r.result("linear").read_text()) for r in (run, derived))
    src_dense, q_dense = (json.loads(r.result("dense_synthetic").read_text()) for r in (run, derived))
    # probed with the run's training seed, the source by the command and the quantized copy inside quantize
    assert src_lin["seed"] == q_lin["seed"] == src_dense["seed"] == q_dense["seed"] == 1
    assert (q_lin["train_images"], q_lin["val_images"]) == (src_lin["train_images"], src_lin["val_images"]) == (32, 8)
    assert obj["linear_top1"] == {"fp32": src_lin["best"]["top1"], "quant": q_lin["best"]["top1"],
                                  "delta": pytest.approx(q_lin["best"]["top1"] - src_lin["best"]["top1"])}
    assert obj["dense"]["dense_synthetic"]["fp32"] == pytest.approx(100 * src_dense["mIoU"])
    for c in (obj["online_top1"], obj["linear_top1"], *obj["dense"].values()):
        assert c["delta"] == pytest.approx(c["quant"] - c["fp32"])

    # the derived checkpoint loads with the edit on: weights on their per-tensor grid
    model, cfg = load_backbone(derived.last, reapply)
    assert cfg.trainfree.method == "w8a8" and cfg.trainfree.source == str(ckpt)
    w = model.blocks[0].mlp.fc2.weight
    step = scale_of(w.abs().max(), 8)
    assert torch.allclose(w / step, (w / step).round(), atol=1e-3)
    # the leaderboard: the quant columns on the run's row, the derived run nested out of sight
    assert QuantResult.collect(run) == pytest.approx(QuantResult.from_json(obj).values(), nan_ok=True)
    assert [r.name for r in find_runs(runs)] == ["q"]


def test_without_a_checkpoint_or_a_model_the_command_says_what_to_pass(runs: Path) -> None:
    with pytest.raises(BadValue, match="ckpt=.*model.pretrained="):
        quantize(tiny_cfg(runs))


def test_the_cli_reports_bad_input_on_one_line(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli([*TINY, f"runs_dir={runs}"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: name the model: ckpt=") and len(err.strip().splitlines()) == 1


def test_a_model_whose_activations_overflow_is_refused_and_nothing_is_written(runs: Path, tmp_path: Path) -> None:
    model = tiny_vit()
    with torch.no_grad():
        model.blocks[0].norm2.weight.fill_(1e38)  # finite weights, infinite fc1 inputs
    weights = tmp_path / "overflow.pt"
    torch.save(model.state_dict(), weights)
    with pytest.raises(NonFinite, match="nothing was written"):
        quantize(tiny_cfg(runs, f"model.pretrained={weights}", "quant.n_images=4", "quant.calib_images=4"))
    assert not list(runs.glob("**/quant.json"))


def test_the_quantized_probes_take_the_source_settings_and_images(runs: Path) -> None:
    cfg = tiny_cfg(runs, "eval.linear_epochs=3")
    src = tiny_cfg(runs, "eval.linear_epochs=7", "eval.dense_epochs=5")
    source = {"linear": {"train_images": 64, "val_images": 32, "best": {"top1": 50.0}},
              "dense_synthetic": {"train_images": 40, "val_images": 32, "mIoU": 0.25}}
    ev = probe_eval(cfg, src, source, ["linear_epochs"])  # the command line set eval.linear_epochs
    assert (ev.linear_epochs, ev.dense_epochs, ev.max_train_images, ev.max_val_images) == (3, 5, 64, 32)
    assert probe_eval(cfg, src, {}, None).linear_epochs == 3  # from Python: the caller's config
    derived = RunDir(runs / "d")
    derived.results.mkdir(parents=True)
    derived.result("linear").write_text(json.dumps({"train_images": 64, "val_images": 32, "best": {"top1": 45.0}}))
    derived.result("dense_synthetic").write_text(json.dumps({"train_images": 32, "val_images": 32, "mIoU": 0.2}))
    linear_change, dense_changes = probe_changes(derived, source)
    assert linear_change == {"fp32": 50.0, "quant": 45.0, "delta": -5.0}
    assert dense_changes == {}  # its probe saw other training images: not compared
    # probes of two seeds are not compared (a result that records none is, as before seeds were recorded)
    derived.result("linear").write_text(json.dumps({"train_images": 64, "val_images": 32, "seed": 1,
                                                    "best": {"top1": 45.0}}))
    assert probe_changes(derived, {"linear": {**source["linear"], "seed": 0}})[0] is None
    assert probe_changes(derived, {"linear": {**source["linear"], "seed": 1}})[0] is not None
    # a dense result written before the seed was recorded on top: its head's seed
    derived.result("dense_synthetic").write_text(json.dumps({"train_images": 40, "val_images": 32, "mIoU": 0.2,
                                                             "probes": [{"seed": 1}]}))
    dense = {"dense_synthetic": {**source["dense_synthetic"], "probes": [{"seed": 0}]}}
    assert probe_changes(derived, dense)[1] == {}
    assert probe_changes(derived, {"dense_synthetic": {**dense["dense_synthetic"], "seed": 1}})[1] != {}


def test_a_second_weights_file_of_the_same_name_is_refused_and_the_first_result_kept(runs: Path,
                                                                                      tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "w.pt", tmp_path / "b" / "w.pt"
    for i, f in enumerate((first, second)):
        f.parent.mkdir()
        torch.manual_seed(i)
        torch.save(tiny_vit().state_dict(), f)
    small = ("quant.n_images=4", "quant.calib_images=4", "quant.probes=false")
    _, path = quantize(tiny_cfg(runs, f"model.pretrained={first}", *small))
    assert path == runs / "w" / "results" / "quant.json"  # in its import, named by the file as every command names it
    before = path.read_bytes()
    with pytest.raises(BadValue, match=re.escape(f"{runs / 'w'} holds the import of {first.resolve()}: delete")):
        quantize(tiny_cfg(runs, f"model.pretrained={second}", *small))
    assert path.read_bytes() == before
    _, again = quantize(tiny_cfg(runs, f"model.pretrained={first}", *small))  # the same model again: its folder
    assert again == path
