"""The exported folder: timm's own folder where timm builds the variant (plain `timm.create_model("local-dir:...")`
computes the features of the folder's weights as vitsinks does), vitsinks' layout elsewhere, both read back by
`vitsinks.pretrained.load`; what `out` may be, and that nothing of the user's is touched; derived and imported runs
refused; the upload through huggingface_hub to a local stand-in of the hub (tests/helpers/hub_standin.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import timm
import torch
from huggingface_hub import HfApi, ModelCard
from timm.models.naflexvit import NaFlexVit

from tests.helpers.exported_runs import make_run, write_checkpoint
from tests.helpers.hub_standin import TOKEN, standin_hub
from tests.helpers.tiny import images, tiny_cfg
from vitsinks import pretrained
from vitsinks.data.selection import IMAGENET_NORMALIZE
from vitsinks.publish.folder import FILES, push, write_folder
from vitsinks.train.checkpoint import load_backbone
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import RunDir


def export(runs: Path, ckpt: Path, out: Path, *overrides: str) -> Path:
    cfg = tiny_cfg(runs, f"ckpt={ckpt}", f"export.out={out}", *overrides)
    return write_folder(cfg)[0]


def folder_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@torch.no_grad()
def test_a_gated_run_exports_as_timms_folder_and_loads_back_in_both_libraries(runs: Path, tmp_path: Path) -> None:
    run = make_run(runs, "gr", "exp=gate+reg")
    out = export(runs, run.last, tmp_path / "out")
    assert folder_files(out) == sorted(FILES)
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"] == "naflexvit_base_patch16_gap" and config["model_args"]["attn_gated"] is True
    pre = config["pretrained_cfg"]
    assert pre["input_size"] == [3, 32, 32] and pre["mean"] == list(IMAGENET_NORMALIZE["mean"])
    assert config["vitsinks"]["source"] == {"run": "gr", "checkpoint": "last.pt", "step": 7, "epoch": 1,
                                            "sha256": files.sha256(run.last)}

    theirs = timm.create_model(f"local-dir:{out}", pretrained=True).eval()  # plain timm, config.json alone
    ours = pretrained.load(f"vitsinks:{out}")
    source, _ = load_backbone(run.last)
    x = images(3)
    assert isinstance(theirs, NaFlexVit) and ours.model.variant == "gate+reg"
    assert torch.equal(theirs.forward_features(x), ours.model.forward_features(x))
    torch.testing.assert_close(theirs.forward_features(x), source.eval().forward_features(x), rtol=1e-5, atol=1e-5)
    assert config["vitsinks"]["check"]["max_abs_diff"] <= 1e-5
    assert ModelCard((out / "README.md").read_text()).data.library_name == "timm"
    assert f'timm.create_model("local-dir:{out}", pretrained=True)' in (out / "README.md").read_text()


@torch.no_grad()
def test_a_variant_timm_cannot_build_keeps_vitsinks_layout_and_loads_back_exactly(runs: Path, tmp_path: Path) -> None:
    run = make_run(runs, "relu", "exp=relu", "model.registers=2")
    out = export(runs, run.last, tmp_path / "out", "export.license=mit")
    config = json.loads((out / "config.json").read_text())
    assert "architecture" not in config and config["vitsinks"]["layout"] == "vitsinks"
    assert any("relu" in r for r in config["vitsinks"]["not_timm"])
    card = ModelCard((out / "README.md").read_text())
    assert (card.data.library_name, card.data.license) == ("vitsinks", "mit")
    source, _ = load_backbone(run.last)
    back = pretrained.load(f"vitsinks:{out}").model
    for k, v in source.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert back.variant == "relu+reg2"


def test_out_must_be_new_empty_or_an_earlier_export_of_the_same_checkpoint(runs: Path, tmp_path: Path) -> None:
    run = make_run(runs, "reg", "exp=reg")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    with pytest.raises(BadValue, match="not empty and holds no vitsinks export"):
        export(runs, run.last, mine)
    assert folder_files(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "the user's"
    assert folder_files(tmp_path) == ["mine", "runs"]  # no staging folder left

    (tmp_path / "empty").mkdir()
    out = export(runs, run.last, tmp_path / "empty")
    assert folder_files(out) == sorted(FILES)
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main")
    config = (out / "config.json").read_text()
    (out / "README.md").write_text("stale")
    export(runs, run.last, out)  # again, the same checkpoint: our files replaced, the user's kept
    assert folder_files(out) == sorted([*FILES, ".git"]) and (out / ".git" / "HEAD").is_file()
    assert (out / "README.md").read_text() != "stale" and (out / "config.json").read_text() == config

    write_checkpoint(run, tiny_cfg(runs, "name=reg", "exp=reg"), seed=1)  # another checkpoint at the same path
    with pytest.raises(BadValue, match=r"holds the export of another checkpoint \(reg/last.pt, step 7\)"):
        export(runs, run.last, out)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(BadValue, match="is a file"):
        export(runs, run.last, tmp_path / "afile")


def test_a_derived_or_imported_run_is_refused_with_what_to_export(runs: Path, tmp_path: Path) -> None:
    src = make_run(runs, "base", "exp=base")
    derived = RunDir(runs / "base+w8a8")
    cfg = tiny_cfg(runs, "name=base+w8a8", "trainfree.method=w8a8", f"trainfree.source={src.last}")
    derived.start(cfg)
    write_checkpoint(derived, cfg)
    with pytest.raises(BadValue, match=rf"derived run .*export the trained checkpoint, ckpt={src.last}"):
        export(runs, derived.last, tmp_path / "out")
    imported = RunDir(runs / "timm_model")
    cfg = tiny_cfg(runs, "name=timm_model")
    cfg.imported = "vit_small_patch16_224.augreg_in21k"
    imported.start(cfg)
    write_checkpoint(imported, cfg)
    with pytest.raises(BadValue, match="import of the pretrained model vit_small_patch16_224"):
        export(runs, imported.last, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_loose_checkpoint_exports_and_its_card_names_the_missing_results(runs: Path, tmp_path: Path) -> None:
    run = make_run(runs, "gate", "exp=gate")
    loose = tmp_path / "gate.pt"
    loose.write_bytes(run.last.read_bytes())
    out = export(runs, loose, tmp_path / "out")
    card = (out / "README.md").read_text()
    assert "## Missing results" in card and "python -m vitsinks.diagnose ckpt=" in card


def test_push_uploads_the_folder_through_huggingface_hub_to_a_stand_in(runs: Path, tmp_path: Path) -> None:
    run = make_run(runs, "gr", "exp=gate+reg")
    out = export(runs, run.last, tmp_path / "out", "export.repo=me/gate-reg")
    (out / "notes.txt").write_text("not uploaded")
    with standin_hub(tmp_path / "hub") as hub:
        url = push(out, "me/gate-reg", private=True, api=HfApi(endpoint=hub.url, token=TOKEN))
        held = hub.repo("me/gate-reg")
        assert folder_files(held) == sorted(FILES) and hub.private["me/gate-reg"] is True
        for name in FILES:
            assert (held / name).read_bytes() == (out / name).read_bytes()
        assert ("POST", "/api/validate-yaml") in hub.requests and url.startswith(f"{hub.url}/me/gate-reg/commit/")
        push(out, "me/gate-reg", api=HfApi(endpoint=hub.url, token=TOKEN))  # again: the repository exists
        with pytest.raises(BadValue, match=r"refused me/gate-reg \(HTTP 401.*hf auth login.*is kept"):
            push(out, "me/gate-reg", api=HfApi(endpoint=hub.url, token="hf_wrong"))
    with pytest.raises(BadValue, match="cannot be reached .* check the network, or HF_ENDPOINT; the folder .* is kept"):
        push(out, "me/gate-reg", api=HfApi(endpoint="http://127.0.0.1:9", token=TOKEN))
    assert folder_files(out) == sorted([*FILES, "notes.txt"])
    assert 'timm.create_model("hf-hub:me/gate-reg", pretrained=True)' in (out / "README.md").read_text()
    assert os.access(out / "model.safetensors", os.R_OK)
