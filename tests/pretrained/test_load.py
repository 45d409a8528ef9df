"""`pretrained.load` by one string, and the command line's route for a pretrained model: `python -m vitsinks.diagnose
hub=...` writes what `pretrained.report` writes, the same numbers as `pretrained.diagnose_fields` on the same images."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from tests.helpers.commands import run_command
from tests.helpers.requirements import require, require_fashion_mnist
from tests.helpers.saved_models import TIMM_NAME, model_alone
from vitsinks.configs.schema import load_config
from vitsinks.data import build_dataset
from vitsinks.data.selection import select_items
from vitsinks.pretrained import diagnose_fields, intervene, load
from vitsinks.utils.errors import BadValue


def timm_weights(tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    """Random vit_tiny weights saved to a file, with a [CLS] sink planted in head 1 of block 5 (every query the same
    vector; keys read channel 0, where [CLS] stands out)."""
    torch.manual_seed(0)
    m = timm.create_model(TIMM_NAME, pretrained=False)
    with torch.no_grad():
        qkv, hd, dim = m.blocks[5].attn.qkv, m.blocks[5].attn.head_dim, m.embed_dim
        q, k = slice(hd, 2 * hd), slice(dim + hd, dim + 2 * hd)
        qkv.weight[q], qkv.bias[q], qkv.weight[k], qkv.bias[k] = 0.0, 1.0, 0.0, 0.0
        qkv.weight[k, 0] = 1.0
        m.cls_token[0, 0, 0] = 1e3
    path = tmp_path / "tiny.pth"
    torch.save(m.state_dict(), path)
    return m.eval(), path


def picture(seed: int = 0, size: tuple[int, int] = (300, 260)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def test_load_timm_from_a_file(tmp_path: Path) -> None:
    m, path = timm_weights(tmp_path)
    got = load(f"timm:{TIMM_NAME}@{path}")
    assert not got.model.training and got.spec == f"timm:{TIMM_NAME}@{path.resolve()}"
    for k, v in m.state_dict().items():
        torch.testing.assert_close(got.model.state_dict()[k], v, rtol=0, atol=0)
    x = got.images([picture(0), picture(1).convert("L")])  # grey images go in as RGB
    assert x.shape == (2, 3, 224, 224)
    # `shown` undoes the normalisation: the model's input is the resized, cropped picture (bicubic: a few levels off)
    cropped = timm.data.create_transform(**timm.data.resolve_data_config({}, model=m)).transforms[:2]
    want = np.asarray(cropped[1](cropped[0](picture(0))), dtype=np.float64)
    assert np.abs(got.shown(x)[0].astype(np.float64) - want).max() <= 1.0


def test_load_a_transformers_folder(tmp_path: Path) -> None:
    transformers = require("transformers")
    cfg = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8)
    model = transformers.Dinov2Model(cfg).eval()
    model.save_pretrained(tmp_path / "dino")
    proc = transformers.BitImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32},
                                          image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.25, 0.3])
    proc.save_pretrained(tmp_path / "dino")
    got = load(f"hf:{tmp_path / 'dino'}")
    assert type(got.model).__name__ == "Dinov2Model" and got.mean == (0.5, 0.4, 0.3)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got.model.state_dict()[k], v, rtol=0, atol=0)
    assert got.images([picture(2)]).shape == (1, 3, 32, 32)


@pytest.mark.parametrize("kind", ["dinov2", "vit", "clip"])
def test_a_folder_without_a_processor_gets_the_config_size_and_imagenet_statistics(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / kind
    model, (h, w) = model_alone(folder, kind)
    capsys.readouterr()
    got = load(f"hf:{folder}")
    notes = [line for line in capsys.readouterr().out.splitlines() if "no image processor" in line]
    assert len(notes) == 1 and f"{h}x{w} px" in notes[0] and "ImageNet" in notes[0]
    assert f"processor.save_pretrained({str(folder)!r})" in notes[0]
    assert type(got.model) is type(model)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got.model.state_dict()[k], v, rtol=0, atol=0)
    assert (got.mean, got.std) == (timm.data.IMAGENET_DEFAULT_MEAN, timm.data.IMAGENET_DEFAULT_STD)
    # any picture comes out at the config's size; one already that size is only normalised: (x / 255 - mean) / std
    assert got.images([picture(3), picture(4, (20, 90))]).shape == (2, 3, h, w)
    pixels = np.asarray(picture(5, (h, w)), dtype=np.float64)
    mean, std = np.array(timm.data.IMAGENET_DEFAULT_MEAN), np.array(timm.data.IMAGENET_DEFAULT_STD)
    want = ((pixels / 255 - mean) / std).transpose(2, 0, 1)
    x = got.images([picture(5, (h, w))])
    np.testing.assert_allclose(x[0].double().numpy(), want, rtol=0, atol=1e-6)
    # a uniform picture of another size stays uniform through the resize
    flat = got.transform(Image.fromarray(np.full((70, 25, 3), (10, 120, 250), dtype=np.uint8)))
    want_flat = (np.array([10, 120, 250]) / 255 - mean) / std
    np.testing.assert_allclose(flat.double().numpy(), np.broadcast_to(want_flat[:, None, None], (3, h, w)), atol=1e-5)
    assert np.array_equal(got.shown(x)[0], pixels.astype(np.uint8))  # `shown` undoes that normalisation


def test_a_hub_id_without_a_processor_keeps_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Only a local folder gets the assumed preprocessing: a hub id (here in an offline cache, the model alone) whose
    repository has no processor is refused in one line."""
    from huggingface_hub import constants

    commit = "0" * 40
    repo = tmp_path / "cache" / "models--someone--tiny"
    model_alone(repo / "snapshots" / commit, "dinov2")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # no folder someone/tiny here
    capsys.readouterr()
    with pytest.raises(BadValue, match=r"^hf:someone/tiny: .*preprocessor_config\.json") as e:
        load("hf:someone/tiny")
    assert "\n" not in str(e.value) and "no image processor" not in capsys.readouterr().out


@pytest.mark.slow
def test_the_command_line_reads_a_folder_without_a_processor(tmp_path: Path) -> None:
    require_fashion_mnist()
    model_alone(tmp_path / "dino", "dinov2")
    out = run_command([sys.executable, "-m", "vitsinks.diagnose", f"hub=hf:{tmp_path / 'dino'}", "data=fashion_mnist",
                       "n_images=3", f"runs_dir={tmp_path / 'runs'}", "diagnostics.report_images=2"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("no image processor saved beside the model") == 1
    folder = tmp_path / "runs" / "diagnostics" / "hf_dino"
    assert f"outputs in {folder}" in out.stdout
    for name in ("summary.json", "report.html", "sink_table.md"):
        assert (folder / name).stat().st_size > 500, name
    # the 28 px Fashion-MNIST pictures went in at the config's 32 px: [CLS] + (32 / 8)^2 patches per image
    assert np.load(folder / "per_image.npz")["res_norm"].shape[0::2] == (3, 1 + 16)


@pytest.mark.parametrize(("spec", "message"), [
    ("dinov2", "names no pretrained model"), ("timm:", "names no pretrained model"),
    ("torchhub:x", "names no pretrained model"), ("hf:some/model@v1", "no @"),
    (f"timm:{TIMM_NAME}@/no/such/file.pth", "no such weights file"), ("open_clip:ViT-B-32", "name its weights"),
])
def test_bad_specs_get_one_line(spec: str, message: str) -> None:
    if spec.startswith("open_clip"):
        require("open_clip")
    with pytest.raises(BadValue, match=message):
        load(spec)


def test_the_command_line_is_the_api(tmp_path: Path) -> None:
    require_fashion_mnist()
    _, path = timm_weights(tmp_path)
    hub = f"timm:{TIMM_NAME}@{path}"
    out = run_command([sys.executable, "-m", "vitsinks.diagnose", f"hub={hub}", "data=fashion_mnist", "n_images=3",
                       f"runs_dir={tmp_path / 'runs'}", "diagnostics.report_images=2"])
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "runs" / "diagnostics" / f"timm_{TIMM_NAME}@tiny"  # a weights file: by its stem
    assert f"outputs in {folder}" in out.stdout
    for name in ("summary.json", "report.html", "attention_maps.png", "sink_table.md"):
        assert (folder / name).stat().st_size > 500, name
    # another file of the same name is refused before its model is loaded, the first one's results untouched
    other = tmp_path / "elsewhere" / "tiny.pth"
    other.parent.mkdir()
    other.write_bytes(path.read_bytes())
    again = run_command([sys.executable, "-m", "vitsinks.diagnose", f"hub=timm:{TIMM_NAME}@{other}",
                         "data=fashion_mnist", "n_images=3", f"runs_dir={tmp_path / 'runs'}"])
    assert again.returncode != 0 and "holds the results of" in again.stderr and "Loading" not in again.stdout
    saved = np.load(folder / "per_image.npz")
    # the same images, chosen as every command chooses them (the selection's order), diagnosed from Python
    loaded, cfg = load(hub), load_config(["data=fashion_mnist"])
    ((items, index),) = select_items(build_dataset(cfg.data, "val", 0), [3], cfg.selection)
    assert saved["image_index"].tolist() == index
    d = diagnose_fields(loaded.model, loaded.images([it[0] for it in items]))
    np.testing.assert_array_equal(saved["sink_idx"], d["sink_idx"])
    for k in ("mass", "ratio_out", "stable_rank", "res_norm"):
        np.testing.assert_allclose(saved[k], d[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_the_intervene_command_is_the_api(tmp_path: Path) -> None:
    require_fashion_mnist()
    _, path = timm_weights(tmp_path)
    hub, edits = f"timm:{TIMM_NAME}@{path}", ["zero_sink_value", "mean_sink_value"]
    out = run_command([sys.executable, "-m", "vitsinks.intervene", f"hub={hub}", "data=fashion_mnist", "n_images=4",
                       "heldout_images=2", "intervene.batch_size=2", "heads=5:1", f"edits=[{','.join(edits)}]",
                       f"runs_dir={tmp_path / 'runs'}"])
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "runs" / "interventions" / f"timm_{TIMM_NAME}@tiny"
    rows = list(csv.DictReader((folder / "interventions.csv").open()))
    assert sorted({r["edit"] for r in rows}) == sorted(edits) and len(rows) == 8
    # the same images, head and edits from Python; the held-out images are the next two of the same order
    loaded, cfg = load(hub), load_config(["data=fashion_mnist", "intervene.n_images=4", "intervene.heldout_images=2"])
    (edited, index), (heldout, _) = select_items(build_dataset(cfg.data, "val", 0), [4, 2], cfg.selection)
    assert sorted({int(r["image_index"]) for r in rows}) == sorted(index)
    got = intervene(loaded.model, loaded.images([it[0] for it in edited]), heads=[(5, 1)], edits=edits,
                    heldout=loaded.images([it[0] for it in heldout]), batch_size=2)["rows"]
    want = {(int(r["image"]), r["edit"]): float(r["final_patch_relrms"]) for r in rows}
    assert len(got["edit"]) == len(want)
    for i, e, v in zip(got["image"], got["edit"], got["final_patch_relrms"], strict=True):
        assert v == pytest.approx(want[(int(i), e)], rel=1e-4)
