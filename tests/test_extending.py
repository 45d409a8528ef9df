"""docs/extending.md followed, each recipe once, touching only the files the page names: a data set, an objective,
three probe protocols, a model family and a post-hoc method written in a user's own module (`plugins=`) with their
configs in a user's config folder, run through the commands in-process; an attention kind and a block mitigation
written into a copy of the package, trained by `python -m vitsinks.launch`. Whatever a test registers is unregistered
after it."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers.tiny import TINY, trained
from vitsinks.backbones import ADAPTERS
from vitsinks.data.datasets import DATASETS
from vitsinks.models import KINDS, MITIGATIONS
from vitsinks.objectives import OBJECTIVES
from vitsinks.posthoc import METHODS
from vitsinks.probes.dense_protocols import DENSE_PROTOCOLS
from vitsinks.probes.knn_protocols import KNN_PROTOCOLS
from vitsinks.probes.linear_protocols import LINEAR_PROTOCOLS
from vitsinks.utils.metrics_log import read_metrics
from vitsinks.utils.registry import Registry
from vitsinks.utils.results import RESULTS

REGISTRIES: tuple[Registry, ...] = (KINDS, MITIGATIONS, ADAPTERS, OBJECTIVES, DATASETS, DENSE_PROTOCOLS,
                                    LINEAR_PROTOCOLS, KNN_PROTOCOLS, METHODS, RESULTS)

# A user's module, as docs/extending.md writes each part of it: every open set is registered where it is defined.
PLUGIN = '''
"""A user's extensions of vitsinks: a data set, an objective, a linear, a k-NN and a dense probe protocol, a model
family and a post-hoc method."""

import dataclasses

import numpy as np
import torch
from PIL import Image
from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.utils.data import Dataset

from vitsinks.backbones.adapter import ADAPTERS, Adapter
from vitsinks.backbones.timm_vit import TimmViT
from vitsinks.data.datasets import DATASETS, DataSet
from vitsinks.data.crops import collate_views
from vitsinks.probes.dense_protocols import DENSE_PROTOCOLS
from vitsinks.probes.knn_protocols import KNN_PROTOCOLS, KnnProtocol
from vitsinks.probes.linear_protocols import LINEAR_PROTOCOLS, LinearProtocol
from vitsinks.objectives.objective import OBJECTIVES, Objective
from vitsinks.objectives.supervised import SupervisedSamples
from vitsinks.posthoc.method import METHODS, TrainFreeMethod

BUILT, ADAPTED, FITTED = [], [], []  # what vitsinks asked of this module: the tests read them


class Squares(Dataset):
    """A bright square in one quadrant of a dark image: the quadrant is the class; with `masks`, the square's
    pixels are labelled class + 1 (0: background)."""

    classes = ["top left", "top right", "bottom left", "bottom right"]

    def __init__(self, size, length, seed, masks=False):
        self.size, self.length, self.seed, self.masks = size, length, seed, masks
        self.num_classes = 5 if masks else 4

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        rng = np.random.default_rng([self.seed, i])
        c, half = int(rng.integers(4)), self.size // 2
        s = int(rng.integers(half // 2, half + 1))
        y, x = (c // 2) * half + int(rng.integers(half - s + 1)), (c % 2) * half + int(rng.integers(half - s + 1))
        img = rng.integers(0, 40, (self.size, self.size, 3), dtype=np.uint8)
        img[y : y + s, x : x + s] = 220
        if not self.masks:
            return Image.fromarray(img), c
        label = np.zeros((self.size, self.size), np.uint8)
        label[y : y + s, x : x + s] = c + 1
        return Image.fromarray(img), label


@DATASETS.register
class SquaresSet(DataSet):
    name, label, masks = "vsx_squares", "Squares", True

    @classmethod
    def images(cls, cfg, split, seed, masks=False):
        BUILT.append(("masks" if masks else "images", split))
        length = cfg.train_size if split == "train" else cfg.val_size
        return Squares(cfg.image_size, length, 2 * seed + (split != "train"), masks)

    @classmethod
    def segmentation(cls, cfg, split, seed, voc_background=True):
        return cls.images(cfg, split, seed, masks=True)


@OBJECTIVES.register
class MeanToZero(Objective):
    """Drive the mean final [CLS] embedding to zero: its own term, no probe."""

    name = "vsx_mean"
    bar_metric = "norm"

    def train_samples(self, base):
        return SupervisedSamples(base, self.cfg.views.global_size)

    def collate(self, items):
        return collate_views([None if it is None else ((it[0],), it[1]) for it in items])

    def build_model(self, backbone, num_classes):
        return nn.ModuleDict({"backbone": backbone})

    def loss_terms(self, net, inputs, targets):
        mean = net["backbone"](inputs[0]).mean(0)
        loss = mean.square().sum()
        return loss, {"loss": loss, "norm": mean.norm()}

    def validate(self, model, val_set):
        return {"val/calls": 1.0}


LINEAR_PROTOCOLS.register(LinearProtocol("vsx_linear", "a [CLS]-only probe", pools=("cls",), momentum=0.0))
KNN_PROTOCOLS.register(KnnProtocol("vsx_knn", "a patch-token vote", ks=(1, 3), k=3, temperature=1.0,
                                   feature="avgpool"))
DENSE_PROTOCOLS.register(dataclasses.replace(DENSE_PROTOCOLS["dinov2"], name="vsx_dense", epochs=1, batch_size=4,
                                             label="a one-epoch probe"))


class SquaresViT(VisionTransformer):
    """A model class vitsinks has no adapter for (a timm ViT underneath, so that timm:NAME@FILE loads it)."""


MODEL = __name__ + "_vit"
__all__ = []  # timm's register_model lists its models here


def _create(pretrained=False, pretrained_cfg_overlay=None, **kwargs):
    model = SquaresViT(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=0)
    if pretrained:
        model.load_state_dict(torch.load(pretrained_cfg_overlay["file"], weights_only=True))
    model.pretrained_cfg = {"input_size": (3, 32, 32), "crop_pct": 0.875, "interpolation": "bicubic",
                            "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
    return model


_create.__name__ = MODEL
register_model(_create)


@ADAPTERS.register
class SquaresFamily(Adapter):
    family = "vsx_family"
    priority = 50  # before timm's adapter, which would take the model as a VisionTransformer

    @classmethod
    def matches(cls, model):
        return isinstance(model, SquaresViT)

    @classmethod
    def adapt(cls, model):
        ADAPTED.append(type(model).__name__)
        return dataclasses.replace(TimmViT.adapt(model), family=cls.family)


@METHODS.register
class DampLastBlock(TrainFreeMethod):
    """The last block's MLP branch scaled by a fitted factor: 1 / (1 + its mean output norm) on the fit images."""

    name, label = "vsx_damp", "damped last MLP"

    @classmethod
    def fit(cls, backbone, images, settings):
        FITTED.append(len(images))
        seen = []
        handle = backbone.blocks[-1].mlp_out().register_forward_hook(lambda _m, _a, out: seen.append(out))
        with torch.no_grad():
            x = backbone.embed(images)
            for blk in backbone.blocks:
                x = blk(x)
        handle.remove()
        return {"factor": float(1 / (1 + seen[0].norm(dim=-1).mean()))}

    @classmethod
    def apply(cls, backbone, state):
        factor = float(state["factor"])
        backbone.blocks[-1].mlp_out().register_forward_hook(lambda _m, _a, out: out * factor)
        return backbone
'''

CONFIGS = {  # the user's config folder: one file per group option, as docs/extending.md says
    "data/vsx_squares.yaml": "# A bright square in one quadrant: its class.\nname: vsx_squares\nnum_classes: 4\n",
    "objective/vsx_mean.yaml": "# Drive the mean [CLS] embedding to zero.\nname: vsx_mean\n",
}


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a user's module (`PLUGIN`, its folder on the Python path) beside a config folder
    (`$VITSINKS_CONFIGS`); what it registers (every name `vsx_...`) is unregistered after the test."""
    name = f"vsx_{uuid.uuid4().hex[:8]}"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / f"{name}.py").write_text(PLUGIN)
    for path, text in CONFIGS.items():
        (tmp_path / "configs" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "configs" / path).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "mine"))
    monkeypatch.setenv("VITSINKS_CONFIGS", str(tmp_path / "configs"))
    yield name
    for registry in REGISTRIES:
        for added in [n for n in registry.names() if n.startswith("vsx_")]:
            registry.unregister(added)
    sys.modules.pop(name, None)


def _command(module: str, *args: str) -> None:
    """`python -m vitsinks.<module> args...` in this process (its entry point: `cli`, or `main`)."""
    command = importlib.import_module(f"vitsinks.{module}")
    (getattr(command, "cli", None) or command.main)(list(args))


def test_a_data_set_and_an_objective_of_a_users_module_train_through_launch(plugin: str, runs: Path) -> None:
    _command("launch", *TINY, f"runs_dir={runs}", "name=ext", f"plugins=[{plugin}]", "data=vsx_squares",
             "objective=vsx_mean", "train.max_steps=4", "train.lr=0.1", "train.warmup_epochs=0")
    mine = sys.modules[plugin]
    assert ("images", "train") in mine.BUILT and ("images", "val") in mine.BUILT  # its splits were the run's
    lines = [m for m in read_metrics(runs / "ext") if "loss" in m]
    assert [m["step"] for m in lines] == [1, 2, 3, 4] and "norm" in lines[0]  # its own term, logged
    assert lines[-1]["loss"] < lines[0]["loss"]
    saved = OmegaConf.load(runs / "ext" / "config.yaml")
    assert saved.data.name == "vsx_squares" and saved.objective.name == "vsx_mean" and saved.plugins == [plugin]


def test_probe_protocols_of_a_users_module_probe_and_reach_the_leaderboard(plugin: str, runs: Path) -> None:
    ckpt = trained(runs, "pp")
    probe = [*TINY, f"runs_dir={runs}", f"ckpt={ckpt}", f"plugins=[{plugin}]", "data=vsx_squares",
             "eval.max_train_images=16", "eval.max_val_images=8", "eval.linear_epochs=1", "eval.linear_lrs=[0.01]"]
    _command("eval.linear", *probe, "eval.linear_protocol=vsx_linear", "eval.knn_protocol=vsx_knn")
    _command("eval.dense", *probe, "eval.dense_protocol=vsx_dense", "eval.dense_examples=0")
    results = runs / "pp" / "results"
    linear = json.loads((results / "linear_vsx_linear.json").read_text())
    assert linear["protocol"] == "vsx_linear" and {c["pool"] for c in linear["grid"]} == {"cls"}  # its recipe
    knn = json.loads((results / "knn_vsx_knn.json").read_text())
    assert (knn["protocol"], knn["feature"], knn["temperature"], knn["k"]) == ("vsx_knn", "avgpool", 1.0, 3)
    assert [s["k"] for s in knn["by_k"]] == [1, 3] and knn["top1"] == knn["by_k"][1]["top1"]
    dense = json.loads((results / "dense_vsx_squares_vsx_dense.json").read_text())
    assert dense["protocol"] == "vsx_dense" and dense["protocol_settings"]["epochs"] == 1 and dense["classes"] == 5
    assert not (results / "linear.json").exists() and not (results / "knn.json").exists()  # the defaults' files
    with pytest.raises(SystemExit) as done:
        _command("leaderboard", f"runs={runs}", f"out={runs / 'board'}", f"plugins=[{plugin}]")
    assert done.value.code == 0
    header, row = (runs / "board" / "runs.csv").read_text().splitlines()[:2]
    values = dict(zip(header.split(","), row.split(","), strict=True))
    assert float(values["linear_vsx_linear_top1"]) == pytest.approx(linear["best"]["top1"])
    assert float(values["dense_vsx_squares_vsx_dense"]) == pytest.approx(100 * dense["mIoU"])
    assert float(values["knn_vsx_knn_probe_top1"]) == pytest.approx(knn["top1"])
    board = (runs / "board" / "leaderboard.md").read_text()
    assert "Squares mIoU (a one-epoch probe)" in board and "linear top-1 (a [CLS]-only probe)" in board
    assert "k-NN probe top-1 (k=3, a patch-token vote)" in board


def test_a_model_family_of_a_users_module_is_diagnosed_through_hub(plugin: str, tmp_path: Path) -> None:
    mine = __import__(plugin)
    weights = tmp_path / "squares.pth"
    torch.save(mine._create().state_dict(), weights)
    _command("diagnose", f"hub=timm:{mine.MODEL}@{weights}", f"plugins=[{plugin}]", "data=vsx_squares",
             "n_images=2", "diagnostics.report=false", "diagnostics.plots=false", f"runs_dir={tmp_path / 'runs'}")
    assert mine.ADAPTED and set(mine.ADAPTED) == {"SquaresViT"}  # its adapter built the backbone
    (summary,) = (tmp_path / "runs").rglob("summary.json")
    assert json.loads(summary.read_text())["shape"]["images"] == 2


def test_a_post_hoc_method_of_a_users_module_derives_a_run_through_trainfree(plugin: str, runs: Path) -> None:
    ckpt = trained(runs, "ph")
    _command("trainfree", *TINY, f"runs_dir={runs}", f"ckpt={ckpt}", f"plugins=[{plugin}]",
             "method=vsx_damp", "fit_images=4", "probes=false")
    assert sys.modules[plugin].FITTED == [4]
    derived = runs / "ph+vsx_damp"
    state = torch.load(derived / "checkpoints" / "last.pt", weights_only=False)
    assert state["config"]["trainfree"]["method"] == "vsx_damp" and 0 < state["trainfree"]["factor"] < 1
    assert json.loads((derived / "status.json").read_text())["status"] == "finished"
    assert list((derived / "diagnostics").rglob("summary.json"))  # the edited model, diagnosed


@pytest.mark.parametrize("args, said", [
    (["data.name=vsx_none"], "data.name=vsx_none is no registered data set: choose one of synthetic, "),
    (["objective.name=vsx_none"], "objective.name=vsx_none is no registered objective: choose one of lejepa, "),
    (["eval.dense_protocol=vsx_none"], "eval.dense_protocol=vsx_none is no registered dense-probe protocol"),
    (["eval.knn_protocol=vsx_none"], "eval.knn_protocol=vsx_none is no registered k-NN probe protocol"),
    (["plugins=[vsx_nowhere]"], "plugins: no module vsx_nowhere on the Python path"),
])
def test_an_unregistered_name_stops_the_command_before_any_work(args: list[str], said: str, runs: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        _command("launch", *TINY, f"runs_dir={runs}", *args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 1 and len(lines) == 1 and said in lines[0], lines
    assert "plugins" in args[0] or "docs/extending.md" in lines[0]  # where a new one is added
    assert not runs.exists() or not any(runs.iterdir())  # nothing trained or written


KIND = '''"""Softmax at temperature 2: softmax(s / 2)."""

import torch
from torch import nn

from vitsinks.models.kinds.kind import KINDS, AttentionKind


@KINDS.register
class HalfSoftmax(AttentionKind):
    name = "vsx_half"

    @staticmethod
    def matrix(attn: nn.Module, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        return (s / 2 if future is None else (s / 2).masked_fill(future, float("-inf"))).softmax(dim=-1)

    @staticmethod
    def redirected(attn, s, head, is_sink, hidden):
        masked = (s / 2).masked_fill(is_sink | hidden, float("-inf"))
        empty = masked.amax(-1, keepdim=True) == float("-inf")
        return torch.where(empty, 0.0, masked.softmax(dim=-1))

    @staticmethod
    def reference(attn, s, head, n):
        e = torch.exp(s / 2 - (s / 2).max())
        return e / e.sum()
'''
MITIGATION = '''"""A learned scale of every block's attention update, 1 + alpha (alpha from 0)."""

import torch
from torch import nn

from vitsinks.models.mitigations.mitigation import MITIGATIONS, SwitchMitigation


class UpdateScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(()))

    def add_to(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return o * (1 + self.alpha)


@MITIGATIONS.register
class UpdateScaleMitigation(SwitchMitigation):
    name = "vsx_scale"
    site = "update"
    attr = "vsx_scale"

    @classmethod
    def build(cls, setting: bool, dim: int, num_heads: int) -> UpdateScale:
        return UpdateScale()
'''


@pytest.mark.slow
def test_a_kind_and_a_mitigation_written_into_the_package_train(tmp_path: Path) -> None:
    """The two files of each recipe written into a copy of the package, nothing else changed; `launch exp=<name>`
    trains each variant (run name `<name>-...`), whose config selects it."""
    import vitsinks

    package = tmp_path / "src" / "vitsinks"
    shutil.copytree(Path(vitsinks.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    template = "# @package _global_\n# {}\nmodel:\n  {}\n"
    files = {"models/kinds/vsx_half.py": KIND, "models/mitigations/vsx_scale.py": MITIGATION,
             "configs/exp/vsx_half.yaml": template.format("Softmax at temperature 2.", "attn: vsx_half"),
             "configs/exp/vsx_scale.yaml": template.format("A learned update scale.", "vsx_scale: true")}
    for path, text in files.items():
        (package / path).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(package.parent), "VITSINKS_CONFIGS": ""}
    for exp in ("vsx_half", "vsx_scale"):
        done = subprocess.run([sys.executable, "-m", "vitsinks.launch", f"exp={exp}", *TINY, "train.max_steps=1",
                               f"runs_dir={tmp_path / 'runs'}"], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=600)
        assert done.returncode == 0, done.stderr
        (run,) = (tmp_path / "runs").glob(f"{exp}-*")
        assert json.loads((run / "status.json").read_text())["status"] == "finished"
    state = torch.load(next((tmp_path / "runs").glob("vsx_scale-*")) / "checkpoints" / "last.pt", weights_only=False)
    assert any(k.endswith("vsx_scale.alpha") for k in state["model"])  # the mitigation's module, in every block
