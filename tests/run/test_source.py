"""One model source for every command (`vitsinks.run.source`): each way of naming a model resolves to what it is and
where it came from without writing anything, builds the model that source holds, and two sources or none are one
line."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.saved_models import model_alone
from tests.helpers.tiny import tiny_cfg, tiny_vit, trained
from vitsinks.configs.schema import load_config
from vitsinks.run.imported import imported_run
from vitsinks.run.source import MODEL_SOURCES, is_hub_spec, of_checkpoint, open_model, resolve
from vitsinks.train.checkpoint import load_backbone
from vitsinks.utils.errors import BadValue, InputNotFound
from vitsinks.utils.rundir import RunDir


def tree(root: Path) -> dict[str, int]:
    """Every file under `root` with its modification time (empty when `root` does not exist)."""
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")} if root.exists() else {}


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    """The tiny ViT's weights as a plain state dict file (what `model.pretrained=` imports)."""
    torch.manual_seed(0)
    path = tmp_path / "tinyweights.pth"
    torch.save(tiny_vit().state_dict(), path)
    return path


def test_a_runs_checkpoint_and_a_run_folder(runs: Path) -> None:
    ckpt = trained(runs, "a")
    before = tree(runs)
    got = resolve(tiny_cfg(runs, f"ckpt={ckpt}"))
    assert (got.kind, got.name, got.checkpoint, got.run.path) == ("checkpoint", "a/last", ckpt, runs / "a")
    assert got.trained and got.hub is None and got.method is None and got.recorded == str(ckpt)
    folder = resolve(tiny_cfg(runs, f"run={runs / 'a'}"))
    assert (folder.kind, folder.checkpoint, folder.name, folder.given) == ("run", ckpt, "a/last", f"run={runs / 'a'}")
    assert folder.analyses("quant", runs, claim=False) == runs / "a"
    assert folder.analyses("diagnostics", runs, claim=False) == runs / "a" / "diagnostics" / "last"
    assert tree(runs) == before  # resolving wrote nothing
    opened = open_model(got, tiny_cfg(runs))
    want, cfg = load_backbone(ckpt)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(opened.backbone.forward_features(x), want.eval().forward_features(x))
    assert opened.cfg.name == cfg.name == "a" and opened.inputs.size == (32, 32) and not opened.module.training


def test_a_loose_checkpoint_file_is_named_by_its_file(runs: Path, tmp_path: Path) -> None:
    loose = tmp_path / "elsewhere" / "mine.pt"
    loose.parent.mkdir()
    loose.write_bytes(trained(runs, "b").read_bytes())
    got = resolve(tiny_cfg(runs, f"ckpt={loose}"))
    assert (got.kind, got.name, got.run) == ("checkpoint", "mine", None)
    assert got.analyses("diagnostics", runs, claim=False) == runs / "diagnostics" / "mine"
    assert not (runs / "diagnostics").exists()  # looked only
    stamp = got.identity()
    os.utime(loose, ns=(loose.stat().st_atime_ns, loose.stat().st_mtime_ns + 10**9))  # rewritten in place
    assert of_checkpoint(loose).identity() != stamp


def test_a_pretrained_model_is_imported_only_when_the_command_writes(runs: Path, weights: Path) -> None:
    cfg = tiny_cfg(runs, f"model.pretrained={weights}", "seed=3")
    got = resolve(cfg)
    assert (got.kind, got.name, got.checkpoint) == ("pretrained", "tinyweights", runs / "tinyweights" / "checkpoints"
                                                    / "last.pt")
    opened = open_model(got, cfg)
    assert not runs.exists()  # resolved and built: nothing written
    assert opened.cfg.imported == "tinyweights" and opened.cfg.seed == 3 and opened.cfg.model.pretrained is None
    got.write(opened.module)  # where the command writes its first result
    run = RunDir(runs / "tinyweights")
    assert run.last.is_file()
    want, saved = load_backbone(run.last)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(opened.backbone.forward_features(x), want.eval().forward_features(x))
    assert {k: saved[k] for k in ("name", "imported", "seed")} == {k: opened.cfg[k] for k in ("name", "imported",
                                                                                                 "seed")}
    assert imported_run(cfg).path == run.path  # the same import, read again
    again = resolve(cfg)
    assert again.plan is not None and again.plan.exists
    assert torch.equal(open_model(again, cfg).backbone.forward_features(x), want.eval().forward_features(x))


def test_a_hub_model_is_read_unmodified_by_its_spec(tmp_path: Path) -> None:
    model, _ = model_alone(tmp_path / "dino", "dinov2")
    cfg = load_config([f"hub=hf:{tmp_path / 'dino'}", f"runs_dir={tmp_path / 'runs'}"])
    got = resolve(cfg)
    spec = f"hf:{(tmp_path / 'dino').resolve()}"
    assert (got.kind, got.hub, got.name, got.checkpoint, got.run, got.trained) == ("hub", spec, spec, None, None, False)
    assert got.analyses("diagnostics", cfg.runs_dir, claim=False) == tmp_path / "runs" / "diagnostics" / "hf_dino"
    assert not (tmp_path / "runs").exists() and got.recorded == spec
    with pytest.raises(BadValue, match=r"^export reads a checkpoint of vitsinks' own model \(ckpt=, run= or "
                                       r"model\.pretrained=\), not hub="):
        got.needs_checkpoint("export")
    opened = open_model(got, cfg)
    assert opened.module is not model and type(opened.module) is type(model) and opened.cfg is cfg
    assert opened.inputs.size == (32, 32) and opened.backbone.num_cls == 1
    x = torch.randn(2, 3, 32, 32)
    want = model(pixel_values=x).last_hidden_state
    torch.testing.assert_close(opened.backbone.forward_features(x), want, rtol=1e-5, atol=1e-5)
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    batch, shown = opened.batch([(picture, 0)])
    assert batch.shape == (1, 3, 32, 32) and shown.shape == (1, 32, 32, 3) and shown.dtype == np.uint8
    # an ImageNet-normalised input is brought to the model's own normalisation: the same as normalising it so
    raw = torch.rand(1, 3, 32, 32)
    imagenet = (raw - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)) / torch.tensor(
        [0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    own = (raw - torch.tensor(opened.inputs.mean).view(1, 3, 1, 1)) / torch.tensor(opened.inputs.std).view(1, 3, 1, 1)
    torch.testing.assert_close(opened.inputs.renormalize(imagenet), own)


def test_a_derived_run_of_a_hub_model_names_it(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs" / "trainfree" / "hf_dino+zero_massive")
    run.start(load_config(["trainfree.method=zero_massive", "trainfree.source=hf:/somewhere/dino", "name=x"]))
    got = resolve(load_config([f"run={run.path}"]))
    assert (got.kind, got.hub, got.method, got.checkpoint) == ("run", "hf:/somewhere/dino", "zero_massive", run.last)
    assert not got.trained and got.analyses("quant", tmp_path, claim=False) == run.path
    assert is_hub_spec("timm:vit_tiny_patch16_224") and not is_hub_spec(str(run.last)) and not is_hub_spec("x:y")


@pytest.mark.parametrize("pair", [("ckpt", "hub"), ("run", "hub"), ("model.pretrained", "hub"), ("ckpt", "run"),
                                  ("ckpt", "model.pretrained")])
def test_two_sources_are_one_line(tmp_path: Path, pair: tuple[str, str]) -> None:
    values = {"ckpt": "a.pt", "run": "runs/a", "model.pretrained": "w.pth", "hub": "timm:vit_tiny_patch16_224"}
    args = [f"{k}={values[k]}" for k in pair]
    with pytest.raises(BadValue) as err:
        resolve(load_config(args))
    ordered = " and ".join(a for k in MODEL_SOURCES for a in args if a.startswith(f"{k}="))
    assert str(err.value) == (f"two model sources, {ordered}: name the model once, with one of ckpt=, run=, "
                              f"model.pretrained=, hub=")


@pytest.mark.parametrize(("args", "error", "message"), [
    ([], BadValue, r"^name the model: ckpt=<checkpoint file>, run=<run folder>, model\.pretrained=.* or hub=<timm:"),
    (["ckpt=/no/such/last.pt"], InputNotFound, r"^checkpoint /no/such/last\.pt not found$"),
    (["run=/no/such/run"], InputNotFound, r"^run=/no/such/run: no such folder: .*checkpoints/last\.pt"),
    (["hub=dinov2"], BadValue, r"^hub=dinov2 names no pretrained model: write timm:<name>"),
    (["hub=torchhub:x"], BadValue, r"^hub=torchhub:x names no pretrained model"),
])
def test_a_missing_or_malformed_source_is_one_line(args: list[str], error: type, message: str) -> None:
    with pytest.raises(error, match=message) as err:
        resolve(load_config(args))
    assert "\n" not in str(err.value)
