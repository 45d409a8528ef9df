"""A derived run from the command line: a checkpoint with a planted artifact, edited by `python -m vitsinks.trainfree`,
read back by every command with one more register, on the leaderboard as `base + test-time register`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from tests.helpers.commands import run_module
from tests.helpers.tiny import TINY, tiny_cfg
from tests.helpers.trainfree import source_checkpoint
from vitsinks.models import model_from_config
from vitsinks.posthoc import reapply
from vitsinks.report.collect import collect
from vitsinks.run.derive import derive
from vitsinks.train.checkpoint import load_backbone
from vitsinks.trainfree import cli
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import RunDir


@pytest.mark.slow
def test_a_derived_run_from_the_command_line(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = source_checkpoint(runs)
    out = run_module("vitsinks.trainfree", f"ckpt={path}", "method=test_time_register", "probes=false",
                     "fit_images=8", f"runs_dir={runs}", "diagnostics.n_images=4", "diagnostics.plots=false")
    assert out.returncode == 0, out.stderr
    run = RunDir(runs / "src+test_time_register")
    model, cfg = load_backbone(run.last, reapply)
    assert (model.num_reg_tokens, model.num_prefix_tokens) == (1, 2)
    assert cfg.trainfree.method == "test_time_register" and cfg.trainfree.source == str(path)
    assert torch.load(run.last)["trainfree"]["neurons"][0] == [1, 17]  # the planted unit
    summary = json.loads((run.diagnostics("final") / "summary.json").read_text())
    assert summary["shape"]["images"] == 4
    assert collect(run)["variant"] == "base + test-time register"
    with pytest.raises(SystemExit) as exit_:  # edits do not stack
        cli([f"ckpt={run.last}", "method=mean_massive", "probes=false", f"runs_dir={runs}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(lines) == 1 and "already edited (test_time_register)" in lines[0]


@pytest.mark.slow
def test_a_timm_state_dict_file_is_edited_from_the_command_line(runs: Path) -> None:
    """The third kind of source: a timm model's weights file (a DINOv2-reg layout, 4 registers), `model.pretrained=`.
    The derived checkpoint holds those weights (without the edit's hooks it computes what timm's model does)."""
    torch.manual_seed(0)
    ref = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=0,
                            reg_tokens=4, no_embed_class=True, init_values=1.0).eval()
    weights = runs / "dinov2_like.pth"
    runs.mkdir(parents=True, exist_ok=True)
    torch.save(ref.state_dict(), weights)
    out = run_module("vitsinks.trainfree", *TINY, "exp=reg", f"model.pretrained={weights}",
                     "model.layerscale_init=1.0", "method=zero_massive", "probes=false", "fit_images=8",
                     f"runs_dir={runs}", "diagnostics.n_images=4", "diagnostics.plots=false")
    assert out.returncode == 0, out.stderr
    run = RunDir(runs / "dinov2_like+zero_massive")
    state = torch.load(run.last)
    assert len(state["trainfree"]["channels"]) == 2  # the fitted state: trainfree.massive channels
    model, cfg = load_backbone(run.last, reapply)
    imported = RunDir(runs / "dinov2_like")  # the weights file, imported as a run first: the edit's source
    assert cfg.trainfree.method == "zero_massive" and cfg.trainfree.source == str(imported.last)
    assert cfg.imported == "dinov2_like" and collect(run)["variant"] == "dinov2_like + zeroed massive activations"
    assert collect(imported)["variant"] == "dinov2_like"  # rows named by the model, not merged into `reg`'s
    assert model.num_reg_tokens == 4
    saved = state["model"]  # timm's names are the backbone's: every tensor as saved, the position embedding with a
    torch.testing.assert_close(saved["pos_embed"][:, 1:], ref.pos_embed, rtol=0, atol=0)  # zero row for [CLS]
    assert not saved["pos_embed"][:, 0].any()
    for key, tensor in ref.state_dict().items():
        if key != "pos_embed":
            torch.testing.assert_close(saved[key], tensor, rtol=0, atol=0)
    plain = model_from_config(cfg.model).eval()  # the same architecture, no edit applied
    plain.load_state_dict({k: v for k, v in state["model"].items() if k in plain.state_dict()})
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(plain.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=1e-5)
    assert json.loads((run.diagnostics("final") / "summary.json").read_text())["shape"]["registers"] == 4


def test_an_unknown_method_is_one_line_listing_the_methods(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli([f"ckpt={runs / 'none.pt'}", "method=bogus", f"runs_dir={runs}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code != 0 and len(err) == 1
    assert "unknown post-hoc method 'bogus'" in err[0]
    assert all(m in err[0] for m in ("mean_massive", "test_time_register", "zero_massive"))


def test_a_derived_checkpoint_is_not_derived_again(runs: Path) -> None:
    state = {"neurons": [[0, 0]], "scores": [1.0], "k": 5.0}
    path = source_checkpoint(runs, "trainfree.method=test_time_register", "trainfree.source=elsewhere.pt",
                             planted=False, extra={"trainfree": state})
    model, _ = load_backbone(path, reapply)  # the saved edit goes back on when it is loaded
    assert model.num_reg_tokens == 1
    with pytest.raises(BadValue, match="already edited .* derive from its source elsewhere.pt"):
        derive(tiny_cfg(runs, f"ckpt={path}", "trainfree.method=zero_massive"))
    assert not (runs / "src+zero_massive").exists()


def test_a_saved_edit_without_its_state_is_refused(runs: Path) -> None:
    path = source_checkpoint(runs, "trainfree.method=test_time_register", planted=False)
    with pytest.raises(BadValue, match="holds no fitted state"):
        load_backbone(path, reapply)


def test_an_existing_derived_run_is_kept_unless_overwritten_and_a_periodic_checkpoint_gets_its_own(runs: Path) -> None:
    path = source_checkpoint(runs)
    cfg = tiny_cfg(runs, f"ckpt={path}", "trainfree.method=mean_massive", "trainfree.fit_images=4")
    first = derive(cfg)
    (first.results / "linear.json").parent.mkdir(parents=True)
    (first.results / "linear.json").write_text("{}")  # a result of the first edit
    with pytest.raises(BadValue, match=r"exists already with another edit \(trainfree.fit_images \(4 there, 5 now\)\)"
                       r".*overwrite=true"):
        derive(tiny_cfg(runs, f"ckpt={path}", "trainfree.method=mean_massive", "trainfree.fit_images=5"))
    assert (first.results / "linear.json").is_file()  # nothing lost
    again = derive(cfg, overwrite=True)
    assert again.path == first.path and not (again.results / "linear.json").exists()  # no stale result kept
    step = RunDir(runs / "src").step_checkpoint(10)
    step.write_bytes(path.read_bytes())
    other = derive(tiny_cfg(runs, f"ckpt={step}", "trainfree.method=mean_massive", "trainfree.fit_images=4"))
    assert other.name == "src@step_0000010+mean_massive"
    plain = runs / "src+zero_massive"
    plain.mkdir()
    (plain / "notes.txt").write_text("someone's own files")  # (an empty folder is taken over: nothing to lose)
    with pytest.raises(BadValue, match="not a derived run"):
        derive(tiny_cfg(runs, f"ckpt={path}", "trainfree.method=zero_massive", "trainfree.fit_images=4"))
