"""`python -m vitsinks.export`: its help and one-line errors; end to end, the first run's variant (`gate+reg` on the
default `vit_mini`, trained and probed by `launch`) exported, loaded in plain timm by the card's own line with the
features vitsinks computes on the exported weights, pushed through huggingface_hub to a local stand-in of the hub
and loaded back from there by timm and by vitsinks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

from tests.helpers.commands import run_module
from tests.helpers.hub_standin import TOKEN, standin_hub
from tests.helpers.tiny import TINY
from vitsinks import pretrained
from vitsinks.export import cli
from vitsinks.publish.folder import FILES
from vitsinks.train.checkpoint import load_backbone

QUICK_RUN = ["exp=gate+reg", "train.max_steps=4", "data.train_size=256", "data.val_size=64", "wandb.mode=disabled",
             "eval.max_train_images=64", "eval.max_val_images=32", "eval.linear_epochs=1", "eval.linear_lrs=[0.01]",
             "eval.dense_epochs=1", "diagnostics.n_images=4", "diagnostics.plots=false", "diagnostics.report=false"]


def test_help_names_the_command_and_its_short_keys() -> None:
    done = run_module("vitsinks.export", "--help")
    assert done.returncode == 0, done.stderr
    assert "hub-ready folder" in done.stdout and "out= (export.out=)" in done.stdout and "repo= (export.repo=)" in \
        done.stdout


@pytest.mark.parametrize(("args", "message"), [
    ([], "error: name what to export, one of ckpt=<checkpoint file> or run=<run folder>"),
    (["run=nowhere", "out=x"], "error: run=nowhere has no checkpoints/last.pt"),
    (["ckpt=missing.pt", "out=x"], "error: ckpt=missing.pt: no such checkpoint file"),
    ([f"ckpt={__file__}"], "error: name the folder to write: out=<folder>"),
    ([f"ckpt={__file__}", "out=x", "push=true"], "error: push=true needs the hub repository: repo="),
])
def test_bad_input_is_one_line(args: list[str], message: str, runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli([*TINY, f"runs_dir={runs}", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and err.startswith(message) and len(err.strip().splitlines()) == 1


def card_line(readme: str) -> str:
    """The card's one line that loads the folder in timm."""
    return next(ln for ln in readme.splitlines() if ln.startswith("model = timm.create_model("))


LOAD_BACK = """
import sys, torch, timm
from vitsinks import pretrained
x = torch.load(sys.argv[1], weights_only=True)
theirs = timm.create_model("hf-hub:{repo}", pretrained=True).eval()
ours = pretrained.load("vitsinks:{repo}").model
with torch.no_grad():
    torch.save({{"timm": theirs.forward_features(x), "vitsinks": ours.forward_features(x)}}, sys.argv[2])
"""


@pytest.mark.slow
@torch.no_grad()
def test_the_first_runs_variant_exports_loads_in_plain_timm_and_round_trips_through_a_hub(runs: Path,
                                                                                         tmp_path: Path) -> None:
    trained = run_module("vitsinks.launch", f"runs_dir={runs}", *QUICK_RUN)
    assert trained.returncode == 0, trained.stderr
    run = runs / "gate+reg-vit_mini-synthetic-s0"
    out = tmp_path / "export"
    done = run_module("vitsinks.export", f"run={run}", f"out={out}")
    assert done.returncode == 0, done.stderr
    assert f"to {out} in timm's naflexvit layout" in done.stdout
    readme = (out / "README.md").read_text()
    assert "## Missing results" not in readme  # launch probed and diagnosed it

    line = card_line(readme)  # the card's own line, run as written
    namespace: dict = {"timm": timm}
    exec(line, namespace)  # noqa: S102 - the card this test just wrote
    theirs = namespace["model"]
    assert type(theirs).__name__ == "NaFlexVit" and not theirs.training
    ours = pretrained.load(f"vitsinks:{out}").model
    source, _ = load_backbone(run / "checkpoints" / "last.pt")
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    features = theirs.forward_features(x)
    torch.testing.assert_close(features, ours.forward_features(x), rtol=0, atol=1e-6)  # the exported weights
    torch.testing.assert_close(features, source.eval().forward_features(x), rtol=1e-5, atol=1e-5)  # the source

    with standin_hub(tmp_path / "hub") as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": TOKEN}
        env.pop("HF_HUB_OFFLINE", None)
        pushed = run_module("vitsinks.export", f"run={run}", f"out={out}", "push=true", "repo=me/first-run", env=env)
        assert pushed.returncode == 0, pushed.stderr
        assert "replaced the earlier export of this checkpoint" in pushed.stdout
        for name in FILES:
            assert (hub.repo("me/first-run") / name).read_bytes() == (out / name).read_bytes()
        assert 'timm.create_model("hf-hub:me/first-run", pretrained=True)' in (out / "README.md").read_text()

        no_token = {k: v for k, v in env.items() if k != "HF_TOKEN"}
        refused = run_module("vitsinks.export", f"run={run}", f"out={out}", "push=true", "repo=me/first-run",
                             env=no_token)
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
        assert re.match(r"error: no Hugging Face token .*hf auth login.* the folder .* is kept", refused.stderr)
        assert sorted(p.name for p in out.iterdir()) == sorted(FILES)

        torch.save(x, tmp_path / "x.pt")
        script = LOAD_BACK.format(repo="me/first-run")
        back = subprocess.run([sys.executable, "-c", script, str(tmp_path / "x.pt"), str(tmp_path / "f.pt")],
                              env=env, capture_output=True, text=True)
        assert back.returncode == 0, back.stderr
    got = torch.load(tmp_path / "f.pt", weights_only=True)
    assert torch.equal(got["timm"], features) and torch.equal(got["vitsinks"], features)
