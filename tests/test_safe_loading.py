"""Safe loading, as a user meets it: a hostile pickle planted wherever a command reads a `torch.save` file is never
run, and the command answers in one line; a checkpoint of an earlier vitsinks is converted once and then resumes."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.commands import one_line_error, run_module
from tests.helpers.malicious import plant
from tests.helpers.tiny import TINY, tiny_cfg
from vitsinks.train.checkpoint import load_backbone, load_for_resume
from vitsinks.train.trainer import Trainer
from vitsinks.utils.rundir import RunDir
from vitsinks.utils.safeload import UnsafeFile

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny finished run (every reader below gets its own copy to plant into)."""
    runs = tmp_path_factory.mktemp("safe") / "runs"
    Trainer(tiny_cfg(runs, "name=src", "train.max_steps=3")).fit()
    return runs / "src"


def _copy(trained: Path, tmp_path: Path, name: str = "run") -> Path:
    return Path(shutil.copytree(trained, tmp_path / "runs" / name))


def _refused(out, marker: Path, path: Path) -> str:
    line = one_line_error(out)
    assert not marker.exists(), "the planted pickle ran"
    assert str(path) in line and "nothing was loaded or run" in line
    return line


def test_a_weights_file_passed_as_model_pretrained(tmp_path: Path) -> None:
    marker, evil = tmp_path / "ran", plant(tmp_path / "evil.pth", tmp_path / "ran")
    out = run_module("vitsinks.diagnose", "model=vit_mini", f"model.pretrained={evil}", "data=synthetic",
                     f"runs_dir={tmp_path / 'runs'}")
    _refused(out, marker, evil)


def test_a_weights_file_passed_through_hub(tmp_path: Path) -> None:
    marker, evil = tmp_path / "ran", plant(tmp_path / "evil.pth", tmp_path / "ran", "legacy")
    out = run_module("vitsinks.diagnose", f"hub=timm:vit_tiny_patch16_224@{evil}", "data=synthetic",
                     f"runs_dir={tmp_path / 'runs'}")
    _refused(out, marker, evil)


def test_a_run_checkpoint_at_resume_and_at_diagnosis(trained: Path, tmp_path: Path) -> None:
    run = _copy(trained, tmp_path)
    marker = tmp_path / "ran"
    for ckpt in (run / "checkpoints").glob("*.pt"):
        plant(ckpt, marker)
    out = run_module("vitsinks.launch", *TINY, f"runs_dir={run.parent}", "name=run", "train.max_steps=6")
    _refused(out, marker, run / "checkpoints" / "last.pt")
    _refused(run_module("vitsinks.diagnose", f"ckpt={run / 'checkpoints' / 'last.pt'}"), marker,
             run / "checkpoints" / "last.pt")


def test_a_loose_checkpoint(tmp_path: Path) -> None:
    marker, evil = tmp_path / "ran", plant(tmp_path / "downloads" / "model.pt", tmp_path / "ran", "pickle")
    out = run_module("vitsinks.eval.linear", f"ckpt={evil}", f"runs_dir={tmp_path / 'runs'}")
    one_line_error(out)
    assert not marker.exists()


def test_a_quantized_copy(trained: Path, tmp_path: Path) -> None:
    run = _copy(trained, tmp_path)
    marker = tmp_path / "ran"
    quantized = plant(run / "quant" / "w8a8" / "checkpoints" / "last.pt", marker)
    _refused(run_module("vitsinks.diagnose", f"ckpt={quantized}"), marker, quantized)


def test_a_killed_run_in_a_sweep_manifest(trained: Path, tmp_path: Path) -> None:
    """`launch status` looks for the last checkpoint of a run that was killed: the planted one is passed over."""
    run = _copy(trained, tmp_path)
    marker = tmp_path / "ran"
    for ckpt in (run / "checkpoints").glob("*.pt"):
        plant(ckpt, marker)
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps({**status, "status": "running"}))
    (run / ".lock").write_text(f"pid 1 on {socket.gethostname()}")  # its writer is gone
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"sweep_dir": str(sweep), "runs": [
        {"index": 0, "name": "run", "run_dir": str(run), "job_id": None, "state": "pending"}]}))
    out = run_module("vitsinks.launch", "status", f"sweep={sweep}")
    assert not marker.exists()
    assert "killed" in out.stdout and "no checkpoint yet" in out.stdout, out.stdout + out.stderr


def _as_earlier_vitsinks(path: Path) -> dict:
    """Rewrite a checkpoint as vitsinks wrote them before safe loading: numpy's random state as numpy's tuple."""
    state = torch.load(path, weights_only=True)
    for rng in {id(r): r for r in [state["rng"], *state["rng_by_rank"]]}.values():  # `rng` is rank 0's entry
        n = rng["numpy"]
        rng["numpy"] = (n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    torch.save(state, path)
    return state


def test_an_earlier_vitsinks_checkpoint_is_refused_then_converted_once_and_resumes(trained: Path,
                                                                                  tmp_path: Path) -> None:
    run = _copy(trained, tmp_path)
    last = run / "checkpoints" / "last.pt"
    earlier = _as_earlier_vitsinks(last)
    with pytest.raises(UnsafeFile, match="earlier vitsinks"):
        load_backbone(last)
    line = one_line_error(run_module("vitsinks.diagnose", f"ckpt={last}"))
    assert f"python -m vitsinks.convert file={last} trust=true" in line

    refused = run_module("vitsinks.convert", f"file={last}")  # no trust=true: nothing is read
    assert "trust=true" in one_line_error(refused) and not (run / "checkpoints" / "last.pt.unsafe").exists()
    out = run_module("vitsinks.convert", f"file={last}", "trust=true")
    assert out.returncode == 0, out.stderr
    assert (run / "checkpoints" / "last.pt.unsafe").is_file()  # the original, kept
    path, state = load_for_resume(RunDir(run))
    assert path == last
    key = state["rng"]["numpy"]["key"]
    assert np.array_equal(key.numpy().astype(np.uint32), earlier["rng"]["numpy"][1])
    assert all(torch.equal(state["model"][k], v) for k, v in earlier["model"].items())
    again = run_module("vitsinks.convert", f"file={last}", "trust=true")
    assert "already loads safely" in one_line_error(again)
