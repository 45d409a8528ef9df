"""The mmseg backend's configs: read without being run, merged as mmengine merges them, found in the user's config
folders before the package's; every shipped config reads into a segmentor mmseg builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.requirements import require
from vitsinks.probes.mmseg_config import config_for, names, read
from vitsinks.utils.errors import BadValue, InputNotFound

BOUND = {"size": 32, "width": 48, "depth": 2, "classes": 21, "data_root": "/data/VOC2012", "workers": 0,
         "epochs": 3, "lr": 1e-3, "weight_decay": 1e-4, "batch_size": 4}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's config folder (`$VITSINKS_CONFIGS`) with an empty `mmseg/`."""
    (tmp_path / "mmseg").mkdir()
    monkeypatch.setenv("VITSINKS_CONFIGS", str(tmp_path))
    return tmp_path / "mmseg"


def test_a_config_reads_as_mmengine_reads_it(folder: Path) -> None:
    mmengine_config = require("mmengine.config")
    (folder / "_a.py").write_text("x = 1\nm = dict(a=dict(b=1, c=[1, 2]), t=(3, 4), k='s')\n"
                                  "pipe = [dict(type='A'), dict(type='B', s=(2 * 8, 8 // 3, -1))]\n")
    (folder / "_b.py").write_text("'''a docstring'''\ny = dict(z=-1.5, w=[0] * 3, d={'k': 1, **dict(j=2)})\n")
    (folder / "top.py").write_text("_base_ = ['./_a.py', './_b.py']\nm = dict(a=dict(b=2), t=(5,))\n"
                                   "y = dict(_delete_=True, q=1)\nn = dict(**m, extra=m['t'][0])\nm2 = n\n")
    mine = read(folder / "top.py")
    assert mine == mmengine_config.Config.fromfile(str(folder / "top.py")).to_dict()
    assert mine["m"] == {"a": {"b": 2, "c": [1, 2]}, "t": (5,), "k": "s"} and mine["y"] == {"q": 1}


@pytest.mark.parametrize(("text", "line", "says"), [
    ("import os\n", 1, "is read, never run"),
    ("x = 1\ny = open('f')\n", 2, "is read, never run"),
    ("m = dict(a={{_base_.x}})\n", 1, "mmengine's {{_base_.name}} templates are not read here"),
    ("m = dict(a=size)\n", 1, "size is not assigned above its use"),
    ("m = [1] + 2\n", 1, "can only concatenate list"),
])
def test_a_config_that_would_need_running_is_refused_with_its_line(folder: Path, text: str, line: int,
                                                                   says: str) -> None:
    (folder / "bad.py").write_text(text)
    with pytest.raises(BadValue, match=rf"bad.py:{line}: .*{says}"):
        read(folder / "bad.py")


def test_bases_are_found_user_first_and_must_not_loop(folder: Path) -> None:
    (folder / "_runtime.py").write_text("default_scope = 'mine'\nmodel = dict(type='EncoderDecoder')\n")
    cfg = read(config_for("linear", "voc"), BOUND)  # the package's linear_voc.py on the user's _runtime.py
    assert cfg["default_scope"] == "mine" and cfg["model"]["decode_head"]["type"] == "BNHead"
    assert "data_preprocessor" not in cfg["model"]  # the package's _runtime.py is not read at all
    (folder / "_linear.py").write_text("_base_ = ['./_linear.py']\nmodel = dict(backbone=dict(out_indices=(-2,)))\n")
    mine = read(config_for("linear", "voc"), BOUND)  # the user's _linear.py on the package's, which it replaces
    assert mine["model"]["backbone"]["out_indices"] == (-2,) and mine["model"]["decode_head"]["type"] == "BNHead"
    (folder / "loop.py").write_text("_base_ = ['./loop2.py']\n")
    (folder / "loop2.py").write_text("_base_ = './loop.py'\n")
    with pytest.raises(BadValue, match="loop.py -> loop2.py -> loop.py"):
        read(folder / "loop.py")
    (folder / "twice.py").write_text("_base_ = ['./_voc.py', './_ade20k.py']\n")
    with pytest.raises(BadValue, match="its bases both set .*dataset_type"):
        read(folder / "twice.py", BOUND)
    (folder / "mine_voc.py").write_text("_base_ = ['./linear_voc.py']\n")
    assert "mine_voc" in names() and config_for("mine", "voc") == folder / "mine_voc.py"
    with pytest.raises(InputNotFound, match=r"eval.dense_mmseg_config=mine: no mmseg/mine_ade20k.py .* choose one of "
                                            r"linear, (linear_augmented, )?linear_multilayer, upernet, or add"):
        config_for("mine", "ade20k")


@pytest.mark.parametrize("name", ["linear", "linear_multilayer", "upernet"])
@pytest.mark.parametrize("data", ["ade20k", "voc"])
def test_every_shipped_config_builds_a_segmentor(name: str, data: str) -> None:
    require("mmseg")
    from mmengine.config import Config
    from mmseg.registry import MODELS

    from tests.helpers.tiny import images, tiny_vit
    from vitsinks.backbones import adapt
    from vitsinks.probes.mmseg_adapter import register

    register()
    cfg = read(config_for(name, data), {**BOUND, "classes": 150 if data == "ade20k" else 21})
    assert cfg["train_dataloader"]["dataset"]["type"] == ("ADE20KDataset" if data == "ade20k" else "PascalVOCDataset")
    assert cfg["optim_wrapper"]["optimizer"] == {"type": "AdamW", "lr": 1e-3, "weight_decay": 1e-4}
    assert cfg["model"]["test_cfg"] == {"mode": "slide", "crop_size": (32, 32), "stride": (21, 21)}
    model = {**cfg["model"], "backbone": {**cfg["model"]["backbone"], "model": adapt(tiny_vit().eval())}}
    segmentor = MODELS.build(Config({"model": model}).model).eval()
    with torch.no_grad():
        logits = segmentor(images(2), mode="tensor")
    assert logits.shape[:2] == (2, 150 if data == "ade20k" else 21)


@pytest.mark.parametrize("data", ["ade20k", "voc"])
def test_the_shipped_pipelines_feed_the_native_probes_inputs_and_labels(tmp_path: Path, data: str) -> None:
    require("mmseg")
    from mmengine.config import Config
    from mmseg.registry import DATASETS, MODELS

    from tests.helpers.datasets import ade_folder, voc_folder
    from vitsinks.data.segmentation import ade20k, resize_label, to_input, voc
    from vitsinks.probes.mmseg_adapter import register

    register()
    if data == "ade20k":
        ours, root = ade20k(ade_folder(tmp_path), "train"), tmp_path / "ADEChallengeData2016"
    else:
        ours, root = voc(voc_folder(tmp_path), "train"), tmp_path / "VOCdevkit" / "VOC2012"
    cfg = read(config_for("linear", data), {**BOUND, "classes": 150 if data == "ade20k" else 21,
                                            "data_root": str(root)})
    theirs = DATASETS.build(cfg["train_dataloader"]["dataset"])
    normalise = MODELS.build(Config(cfg["model"]["data_preprocessor"]))
    for i, (img, label) in enumerate(ours):
        item = theirs[i]
        x = normalise({"inputs": [item["inputs"]], "data_samples": [item["data_samples"]]}, training=True)["inputs"]
        torch.testing.assert_close(x[0], to_input(img, 32), rtol=0, atol=1e-6)  # decoded and resized alike
        assert torch.equal(item["data_samples"].gt_sem_seg.data[0].long(), resize_label(label, 32))


def test_the_example_user_config_trains_on_augmented_crops(tmp_path: Path) -> None:
    require("mmseg")
    from mmseg.registry import DATASETS

    from tests.helpers.datasets import ade_folder
    from vitsinks.probes.mmseg_adapter import register

    register()
    path = config_for("linear_augmented", "ade20k")
    assert path.parent.parent.name == "configs" and path.parent.parent.parent != Path(__file__).parents[2] / "vitsinks"
    cfg = read(path, {**BOUND, "classes": 150, "data_root": str(ade_folder(tmp_path) / "ADEChallengeData2016")})
    steps = [t["type"] for t in cfg["train_dataloader"]["dataset"]["pipeline"]]
    assert steps[2:6] == ["RandomResize", "RandomCrop", "RandomFlip", "PhotoMetricDistortion"]
    assert cfg["model"]["decode_head"]["type"] == "BNHead"  # the rest is the package's linear_ade20k.py
    item = DATASETS.build(cfg["train_dataloader"]["dataset"])[0]  # rescaled 0.5-2x, then a crop of at most 32 x 32
    assert item["inputs"].shape[1:] == item["data_samples"].gt_sem_seg.data.shape[1:]
    assert max(item["inputs"].shape[1:]) <= 32
