"""Pretrained weights files (`model.pretrained=`): each way one can be wrong is answered as a weights file's, not a
run checkpoint's, in one short line; a timm name with the hub unreachable fails within seconds."""

from __future__ import annotations

import logging
import math
import socket
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch
from huggingface_hub import constants as hf_constants

from tests.helpers.tiny import TINY_VIT, tiny_vit
from vitsinks.models import model_from_config
from vitsinks.models.mitigations import MITIGATIONS
from vitsinks.models.weights import architecture, hub_reachable, load
from vitsinks.utils.errors import BadValue, InputNotFound, NonFinite


def pretrained(source: Path | str, **arch: object) -> object:
    """The tiny ViT (with `arch` overrides) loading `model.pretrained=source`."""
    return model_from_config({"size": "vit_cpu", **TINY_VIT, **arch, "pretrained": str(source)})


def test_a_torn_or_foreign_weights_file_is_named_a_weights_file_not_a_run_checkpoint(tmp_path: Path) -> None:
    torn = tmp_path / "dinov2.pth"
    torch.save(tiny_vit().state_dict(), torn)
    torn.write_bytes(torn.read_bytes()[:300])
    with pytest.raises(BadValue, match="is truncated or corrupt") as err:
        pretrained(torn)
    assert "download or save it again" in str(err.value)
    assert "resume" not in str(err.value) and "delete" not in str(err.value) and "checkpoint" not in str(err.value)
    notes = tmp_path / "notes.pth"
    notes.write_text("not weights")
    with pytest.raises(BadValue, match="is not a PyTorch weights file") as err:
        pretrained(notes)
    assert "written by vitsinks" not in str(err.value)
    in_run = tmp_path / "run" / "checkpoints" / "last.pt"
    in_run.parent.mkdir(parents=True)
    in_run.write_bytes(torn.read_bytes())
    with pytest.raises(BadValue, match="resume from another checkpoint of the run"):  # a run's checkpoint: as before
        load(in_run)
    with pytest.raises(BadValue, match="copy it again from its run") as err:  # a checkpoint file outside any run
        load(torn)
    assert "resume" not in str(err.value)


def test_a_weights_file_with_nan_is_damaged_not_a_run_that_diverged(tmp_path: Path) -> None:
    sd = tiny_vit().state_dict()
    sd["blocks.0.attn.qkv.weight"][0, 0] = math.nan
    torch.save(sd, tmp_path / "nan.pth")
    with pytest.raises(NonFinite, match="holds non-finite weights") as err:
        pretrained(tmp_path / "nan.pth")
    assert "the file is damaged or the model diverged where it was trained" in str(err.value)
    assert "train.lr" not in str(err.value)


def test_weights_of_another_architecture_name_both_in_one_short_line(tmp_path: Path) -> None:
    other = tiny_vit(embed_dim=96, depth=3, num_heads=4, registers=4, patch_size=4, gate="headwise")
    torch.save(other.state_dict(), tmp_path / "other.pth")
    with pytest.raises(BadValue) as err:
        pretrained(tmp_path / "other.pth")
    msg = str(err.value)
    assert "\n" not in msg and len(msg) <= 500, msg
    assert f"model.pretrained={tmp_path / 'other.pth'} holds a ViT of width 96, depth 3, 4 heads, 4 registers, " \
           f"patch 4, headwise-gated; the model asked for has width 48, depth 2, 3 heads, 0 registers, patch 8, " \
           f"not gated" in msg
    assert "differs in width, depth, heads, registers, patch, gate" in msg
    torch.save(tiny_vit(layerscale_init=1.0).state_dict(), tmp_path / "ls.pth")  # the same but for LayerScale
    with pytest.raises(BadValue, match="not gated, LayerScale; the model asked for .* no LayerScale: .*in layerscale"):
        pretrained(tmp_path / "ls.pth")


def test_what_a_state_dict_holds_is_read_off_its_shapes() -> None:
    assert architecture(tiny_vit(gate="elementwise", attn="sink_logit").state_dict()) == {
        "width": 48, "depth": 2, "heads": 3, "registers": 0, "patch": 8, "gate": "elementwise", "mlp": 4.0,
        "layerscale": False, **{name: False for name in MITIGATIONS if name != "gate"}}
    assert architecture(tiny_vit(attn_bias=True, global_pathway={"enabled": True}).state_dict())["attn_bias"]


def test_a_safetensors_weights_file_loads(tmp_path: Path) -> None:
    ref = tiny_vit(registers=4)
    safetensors.torch.save_file(ref.state_dict(), tmp_path / "model.safetensors")
    model = pretrained(tmp_path / "model.safetensors", registers=4)
    torch.testing.assert_close(model.state_dict(), ref.state_dict())
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "model.safetensors").read_bytes()[:100])
    with pytest.raises(BadValue, match="cut.safetensors is truncated or corrupt"):
        pretrained(tmp_path / "cut.safetensors", registers=4)


def test_a_timm_name_offline_fails_in_seconds_in_one_line_without_retries(
        no_hub: None, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    start = time.monotonic()
    with pytest.raises(BadValue) as err:
        pretrained("vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    took = time.monotonic() - start
    assert took < 10, f"{took:.1f} s"  # it retried the hub for about a minute before
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("model.pretrained=vit_tiny_patch16_224.augreg_in21k_ft_in1k: its weights "
                                              "are not in the local cache")
    assert "the hub (http://127.0.0.1:9) cannot be reached" in msg
    out = capsys.readouterr()
    assert "Retry" not in caplog.text + out.out + out.err
    assert not hf_constants.HF_HUB_OFFLINE  # offline only for that download


def test_a_missing_weights_file_is_not_looked_for_on_the_hub(tmp_path: Path) -> None:
    with pytest.raises(InputNotFound, match="nowhere.pth: no such weights file: check the path"):
        pretrained(tmp_path / "nowhere.pth")


def test_the_hub_check_sees_a_listening_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        monkeypatch.setattr(hf_constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(var, raising=False)
        assert hub_reachable()
    assert not hub_reachable()  # closed now
