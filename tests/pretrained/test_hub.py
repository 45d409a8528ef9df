"""`pretrained.load` answers as `model.pretrained=` does (`vitsinks.pretrained.hub` through `models.weights`): an
unreachable hub is answered from the cache at once, or in one line within seconds (no minute of retries); a weights
file of another architecture names what differs; NaN weights are a damaged file; a missing `hf:` folder is a missing
folder. The hub here is a closed local port, so the tests need no network and hold with one."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import safetensors.torch
import timm
import torch
from huggingface_hub import constants as hf_constants

from tests.helpers.requirements import require
from tests.helpers.saved_models import TIMM_NAME, model_alone
from vitsinks.models.weights import DAMAGED, RUN_DIVERGED
from vitsinks.pretrained import load
from vitsinks.utils.errors import BadValue, InputNotFound, NonFinite

COMMIT = "0" * 40


def snapshot(cache: Path, repo: str) -> Path:
    """The folder of `repo`'s `main` in huggingface_hub's cache layout (what a download leaves)."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    (folder / "snapshots" / COMMIT).mkdir(parents=True)
    return folder / "snapshots" / COMMIT


def printed(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    return caplog.text + out.out + out.err


@pytest.mark.parametrize(("spec", "library"), [
    (f"timm:{TIMM_NAME}", "timm"), ("hf:facebook/dinov2-small", "transformers"),
    ("open_clip:ViT-B-32@openai", "open_clip"),
])
def test_an_unreachable_hub_is_one_line_without_retries(
        no_hub: Path, spec: str, library: str, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    require(library)
    caplog.set_level(logging.WARNING)
    start = time.monotonic()
    with pytest.raises(BadValue) as err:
        load(spec)
    took = time.monotonic() - start
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{spec}: its weights are not in the local cache ({no_hub})")
    assert "the hub (http://127.0.0.1:9) cannot be reached: download them once with the network on" in msg
    said = printed(caplog, capsys)
    assert "Retry" not in said and "Failed to download" not in said, said  # huggingface_hub's, open_clip's
    assert took < 30, f"{took:.0f} s"  # a minute of retries before; generous for a loaded machine
    assert not hf_constants.HF_HUB_OFFLINE  # offline only for that load


def test_cached_timm_weights_load_offline_at_once(no_hub: Path, caplog: pytest.LogCaptureFixture,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.WARNING)
    torch.manual_seed(0)
    want = timm.create_model(TIMM_NAME).state_dict()
    repo = timm.models.get_pretrained_cfg(TIMM_NAME).hf_hub_id
    safetensors.torch.save_file(want, snapshot(no_hub, repo) / "model.safetensors")
    got = load(f"timm:{TIMM_NAME}").model.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], v) for k, v in want.items())
    assert "Retry" not in printed(caplog, capsys)


def test_a_cached_transformers_model_loads_offline_at_once(no_hub: Path, caplog: pytest.LogCaptureFixture,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    transformers = require("transformers")
    caplog.set_level(logging.WARNING)
    folder = snapshot(no_hub, "someone/tiny")
    model, _ = model_alone(folder, "dinov2")
    transformers.BitImageProcessor(crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    got = load("hf:someone/tiny")
    assert type(got.model) is type(model)
    assert all(torch.equal(got.model.state_dict()[k], v) for k, v in model.state_dict().items())
    assert "Retry" not in printed(caplog, capsys)


def small_timm(tmp_path: Path, **kwargs: int) -> Path:
    """A file of `TIMM_NAME`'s weights with the architecture changed by `kwargs` (timm's own arguments)."""
    torch.manual_seed(0)
    path = tmp_path / "other.pth"
    torch.save(timm.create_model(TIMM_NAME, **kwargs).state_dict(), path)
    return path


def test_timm_weights_of_another_architecture_name_what_differs(tmp_path: Path) -> None:
    path = small_timm(tmp_path, depth=2)  # vit_tiny is 12 blocks deep
    with pytest.raises(BadValue) as err:
        load(f"timm:{TIMM_NAME}@{path}")
    msg = str(err.value)
    assert "\n" not in msg and "Error(s) in loading state_dict" not in msg
    assert msg.startswith(f"timm:{TIMM_NAME}@{path} holds a ViT of width 192, depth 2, ")
    assert "the model asked for has width 192, depth 12, 3 heads" in msg
    assert msg.endswith(f"name the timm model of the file's architecture, timm:<name>@{path} (it differs in depth)")
    headless = small_timm(tmp_path, num_classes=0)  # the same architecture without the classifier
    with pytest.raises(BadValue, match=r"but its tensors do not fit \(2 missing, e.g. head.weight, head.bias\)"):
        load(f"timm:{TIMM_NAME}@{headless}")


def test_open_clip_weights_of_another_architecture_name_the_keys(tmp_path: Path) -> None:
    open_clip = require("open_clip")
    for name, width in (("vitsinks-test-clip-48", 48), ("vitsinks-test-clip-64", 64)):
        cfg = {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 2, "width": width, "patch_size": 8,
                                               "head_width": 16},
               "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1}}
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
        open_clip.add_model_config(tmp_path / f"{name}.json")
    torch.manual_seed(0)
    path = tmp_path / "clip48.pt"
    small = open_clip.create_model("vitsinks-test-clip-48").state_dict()
    torch.save(small, path)
    assert load(f"open_clip:vitsinks-test-clip-48@{path}").model.visual.conv1.weight.shape[0] == 48
    big = open_clip.create_model("vitsinks-test-clip-64").state_dict()
    other = [k for k in small if small[k].shape != big[k].shape]  # the vision tower's, computed independently
    with pytest.raises(BadValue) as err:
        load(f"open_clip:vitsinks-test-clip-64@{path}")
    msg = str(err.value)
    assert "\n" not in msg and "Error(s) in loading state_dict" not in msg
    assert f"its tensors do not fit the model ({len(other)} of another shape, e.g. {other[0]}" in msg
    assert "missing" not in msg and "unexpected" not in msg
    assert msg.endswith(f"name the open_clip model of the file's architecture, open_clip:<name>@{path}")


def test_non_finite_weights_are_a_damaged_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    sd = timm.create_model(TIMM_NAME).state_dict()
    sd["blocks.3.mlp.fc1.weight"][0, 0] = float("nan")
    torch.save(sd, tmp_path / "nan.pth")
    with pytest.raises(NonFinite) as err:
        load(f"timm:{TIMM_NAME}@{tmp_path / 'nan.pth'}")
    msg = str(err.value)
    assert "blocks.3.mlp.fc1.weight" in msg and msg.endswith(DAMAGED) and RUN_DIVERGED not in msg


def test_a_transformers_folder_with_inf_weights_is_a_damaged_file(tmp_path: Path) -> None:
    require("transformers")
    model, _ = model_alone(tmp_path / "dino", "dinov2")
    with torch.no_grad():
        model.embeddings.cls_token.fill_(float("inf"))
    model.save_pretrained(tmp_path / "dino")
    with pytest.raises(NonFinite, match=r"embeddings.cls_token: the file is damaged"):
        load(f"hf:{tmp_path / 'dino'}")


@pytest.mark.parametrize("name", ["./nowhere", "~/vitsinks-no-such-folder", "ABSOLUTE", "models/dino"])
def test_a_missing_transformers_folder_is_a_missing_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           name: str) -> None:
    require("transformers")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()  # `models/dino`: a folder that does not exist in one that does
    name = str(tmp_path / "nowhere") if name == "ABSOLUTE" else name
    with pytest.raises(InputNotFound) as err:
        load(f"hf:{name}")
    msg = str(err.value)
    assert msg.startswith(f"hf:{name}: no such folder: check the path") and "repo" not in msg.lower()
