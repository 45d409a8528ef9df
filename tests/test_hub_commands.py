"""Every command on a model of another library (`hub=`): a tiny transformers DINOv2 written by `save_pretrained`,
run as a user runs the commands. The probes read its features through the model seam (checked against the model's
own forward); a derived result (a training-free edit, the W8A8 copy) holds the hub model's name and the fitted state,
and every command reads it back with the edit on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.commands import one_line_error, run_module
from tests.helpers.saved_models import model_alone
from vitsinks.configs.schema import load_config
from vitsinks.data import build_dataset
from vitsinks.models.weights import load as load_file
from vitsinks.pretrained import load
from vitsinks.probes.common import limit
from vitsinks.utils.rundir import RunDir

DATA = ["data=synthetic", "data.image_size=32", "data.train_size=64", "data.val_size=32", "data.num_classes=4",
        "data.num_workers=0"]
EVAL = ["eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1", "eval.linear_lrs=[0.01]",
        "eval.dense_epochs=1"]
FAST = ["diagnostics.n_images=4", "diagnostics.plots=false", "diagnostics.report=false"]
HEAD, BLOCK = 0, 1  # the planted sink head


@pytest.fixture
def dino(tmp_path: Path) -> tuple[torch.nn.Module, str, Path]:
    """(the model, its `hub=` spec, the runs folder): a tiny DINOv2 (2 blocks, 32 px in 8 px patches) saved alone,
    with a [CLS] sink planted in head `HEAD` of block `BLOCK` (every query the same vector; keys read channel 0, where
    [CLS] stands out)."""
    folder = tmp_path / "dino"
    model, _ = model_alone(folder, "dinov2")
    with torch.no_grad():
        att, hd = model.encoder.layer[BLOCK].attention, model.config.hidden_size // model.config.num_attention_heads
        rows = slice(HEAD * hd, (HEAD + 1) * hd)
        att.q_proj.weight[rows], att.q_proj.bias[rows] = 0.0, 1.0
        att.k_proj.weight[rows], att.k_proj.bias[rows] = 0.0, 0.0
        att.k_proj.weight[rows, 0] = 1.0
        model.embeddings.cls_token[0, 0, 0] = 1e3
    model.save_pretrained(folder)
    return model, f"hf:{folder}", tmp_path / "runs"


def command(module: str, *args: str) -> str:
    """Run `python -m module args` and return its stdout (its stderr when it fails)."""
    out = run_module(module, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def probe_features(model: torch.nn.Module, spec: str, split: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The linear probe's features of the first `n` items of `split` (as the probe picks them), from the
    transformers model's own forward: ([CLS] after the final norm of each block (n, 2, D), the mean patch token)."""
    cfg = load_config(DATA)
    ds = limit(build_dataset(cfg.data, split, cfg.seed), n, cfg.selection.seed)
    x = torch.stack([load(spec).transform(ds[i][0].convert("RGB")) for i in range(len(ds))])
    with torch.no_grad():
        out = model(pixel_values=x, output_hidden_states=True)
    cls = torch.stack([model.layernorm(h)[:, 0] for h in out.hidden_states[1:]], dim=1)
    return cls, out.last_hidden_state[:, 1:].mean(1)


@pytest.mark.slow
def test_diagnose_and_intervene_read_a_saved_transformers_model(dino: tuple) -> None:
    _, spec, runs = dino
    out = command("vitsinks.diagnose", f"hub={spec}", f"runs_dir={runs}", *DATA, "n_images=4",
                  "diagnostics.plots=false")
    folder = runs / "diagnostics" / "hf_dino"
    assert f"outputs in {folder}" in out
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["shape"]["images"] == 4 and summary["sinks_per_image"]["all"]["cls"] > 0  # the planted sink
    command("vitsinks.intervene", f"hub={spec}", f"runs_dir={runs}", *DATA, "n_images=4", "heldout_images=2",
            "intervene.batch_size=2", f"heads={BLOCK}:{HEAD}", "edits=[zero_sink_value,mean_sink_value]")
    done = json.loads((runs / "interventions" / "hf_dino" / "summary.json").read_text())
    assert done["heads"] == [f"{BLOCK}:{HEAD}"] and done["n_images"] == 4 and done["subject"].startswith(spec[:3])


@pytest.mark.slow
def test_the_probes_and_quantize_read_a_hub_model_through_the_seam(dino: tuple) -> None:
    model, spec, runs = dino
    command("vitsinks.eval.linear", f"hub={spec}", f"runs_dir={runs}", *DATA, *EVAL)
    command("vitsinks.eval.dense", f"hub={spec}", f"runs_dir={runs}", *DATA, *EVAL)
    run = RunDir(runs / "quant" / "hf_dino")  # a hub model's results: where quantize reads them
    linear = json.loads(run.result("linear").read_text())
    assert linear["checkpoint"] == spec and (linear["train_images"], linear["val_images"]) == (32, 8)
    assert 0 <= json.loads(run.result("dense_synthetic").read_text())["mIoU"] <= 1
    # the cached features are the model's own: [CLS] after the final norm of each block, the mean patch token
    caches = {len(c["index"]): c for c in (load_file(p) for p in run.eval_cache.glob("lin-*.pt"))}
    for split, n in (("train", 32), ("val", 8)):
        cls, patch_mean = probe_features(model, spec, split, n)
        got = caches[n]
        torch.testing.assert_close(got["cls"].float(), cls[got["index"]], rtol=1e-2, atol=1e-2)  # cached in fp16
        torch.testing.assert_close(got["patch_mean"].float(), patch_mean[got["index"]], rtol=1e-2, atol=1e-2)

    out = command("vitsinks.quantize", f"hub={spec}", f"runs_dir={runs}", *DATA, *EVAL, "n_images=4",
                  "calib_images=4", *FAST)
    result = json.loads(run.result("quant").read_text())
    assert f"{run.result('quant')}" in out and result["checkpoint"] == spec and result["online_top1"] is None
    assert 0.9 < result["feature_cosine"] <= 1 + 1e-9 and len(result["feature_cosine_by_block"]) == 2
    assert result["linear_top1"]["fp32"] == linear["best"]["top1"]  # the source's probe, and the copy's
    derived = RunDir(run.path / "quant" / "w8a8")
    state = load_file(derived.last)
    assert state["hub"] == spec and "model" not in state and state["trainfree"]["weight_bits"] == 8  # no weights
    # the W8A8 copy is read back by any command: its probe again, with the quantization on
    command("vitsinks.eval.linear", f"run={derived.path}", f"runs_dir={runs}", *EVAL)
    again = json.loads(derived.result("linear").read_text())
    assert again["checkpoint"] == str(derived.last)


@pytest.mark.slow
def test_a_training_free_edit_of_a_hub_model_is_read_back_by_every_command(dino: tuple) -> None:
    model, spec, runs = dino
    out = command("vitsinks.trainfree", f"hub={spec}", f"runs_dir={runs}", *DATA, *EVAL, *FAST,
                  "method=zero_massive", "fit_images=8")
    derived = RunDir(runs / "trainfree" / "hf_dino+zero_massive")
    assert f"derived run {derived.path} (zero_massive of {spec})" in out
    assert json.loads(derived.status.read_text())["status"] == "finished"
    state = load_file(derived.last)
    assert state["hub"] == spec and "model" not in state and state["config"]["trainfree"]["source"] == spec
    first = json.loads((derived.diagnostics("final") / "summary.json").read_text())
    # read back: the diagnosis of the same model on the same images, and the probe's features with the edit on
    again = command("vitsinks.diagnose", f"run={derived.path}", f"runs_dir={runs}", *FAST)
    assert f"outputs in {derived.diagnostics('last')}" in again
    assert json.loads((derived.diagnostics("last") / "summary.json").read_text())["sinks_per_image"] == \
        first["sinks_per_image"]
    command("vitsinks.eval.linear", f"run={derived.path}", f"runs_dir={runs}", *EVAL)
    cache = {len(c["index"]): c for c in (load_file(p) for p in derived.eval_cache.glob("lin-*.pt"))}[8]
    cls, _ = probe_features(model, spec, "val", 8)
    assert (cache["cls"].float() - cls[cache["index"]]).abs().max() > 1e-1  # the edit is on: not the plain model's


def test_a_command_that_needs_a_trained_checkpoint_says_so_in_one_line(dino: tuple) -> None:
    _, spec, runs = dino
    line = one_line_error(run_module("vitsinks.export", f"hub={spec}", f"out={runs / 'export'}"))
    assert line.startswith("error: export reads a checkpoint of vitsinks' own model (ckpt= or run=), not hub=")
    assert not runs.exists()
