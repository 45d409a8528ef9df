"""The model a command works on, resolved in one place from its config, without writing anything.

    ckpt=<file>                     a vitsinks checkpoint: a run's, a loose file, or a derived run's
    run=<folder>                    a run folder: its `checkpoints/last.pt`
    model.pretrained=<timm name or weights file>
                                    a timm ViT's weights in vitsinks' own model, read as its import
                                    (`vitsinks.run.imported`), written with the command's first result
    hub=<spec>                      a model of an adapted family read unmodified (`vitsinks.pretrained.load`)

`resolve(cfg)` says what the model is (`ModelSource`); `open_model(source, cfg)` builds it (`Opened`: the backbone
through the seam, the module, the run config, how pictures become its input); `for_probes(cfg)` sets it up for the
probes. A derived run of a hub model holds the hub spec (`trainfree.source`) and the fitted state, not the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightly.transforms.utils import IMAGENET_NORMALIZE
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

import vitsinks.quant  # noqa: F401 - registers W8A8: a quantized derived run loads
from vitsinks.backbones import adapt, sinkvit_backbone
from vitsinks.configs.cli import cli_keys, data_overrides, pick_data, pick_seed
from vitsinks.configs.upgrade import upgrade
from vitsinks.data.selection import fixed_images, images_of, select_items, selection_transform
from vitsinks.models import SinkViT, model_from_config
from vitsinks.models.seam import Backbone
from vitsinks.models.weights import load as load_file
from vitsinks.posthoc import method as trainfree_method
from vitsinks.posthoc import reapply
from vitsinks.pretrained.hub import LOADERS, Loaded, canonical, hub_dir, load
from vitsinks.run.imported import PlannedImport, import_config, planned_import, write_import
from vitsinks.train.checkpoint import backbone_from_state, classifier_from_state
from vitsinks.utils import files
from vitsinks.utils.distributed import init_distributed
from vitsinks.utils.errors import BadValue, InputNotFound
from vitsinks.utils.rundir import RunDir, analyses_dir, in_run, model_name, quant_result

MODEL_SOURCES = ("ckpt", "run", "model.pretrained", "hub")  # the ways a command is told its model
HUB_SPECS = "timm:<name>[@<file>], hf:<hub id or folder>, open_clip:<name>@<tag or file> or vitsinks:<export folder>"
IMAGENET = tuple(IMAGENET_NORMALIZE["mean"]), tuple(IMAGENET_NORMALIZE["std"])  # vitsinks' own normalisation
HUB_ANALYSES = "trainfree"  # `<runs_dir>/trainfree/<hub>+<method>/`: a hub model's derived runs


def is_hub_spec(value: str | None) -> bool:
    """`value` names a hub model (`timm:...`, `hf:...`, ...; `pretrained.hub.LOADERS`), not a file or folder here."""
    if not value:
        return False
    family, sep, rest = str(value).partition(":")
    return bool(sep and rest) and family in LOADERS and not Path(str(value)).expanduser().exists()


@dataclass(frozen=True)
class ModelSource:
    """What a command works on (`resolve`): `kind` (`checkpoint`, `run`, `pretrained` or `hub`), `given` (the command
    line's words), `name` (tables and pages), `checkpoint` (None for a hub model), `run` (the run folder holding it),
    `hub` (the canonical spec of the hub model it is or edits), `method` (a derived run's edit), `plan` (an import)."""

    kind: str
    given: str
    name: str
    checkpoint: Path | None = None
    run: RunDir | None = None
    hub: str | None = None
    method: str | None = None
    plan: PlannedImport | None = field(default=None, compare=False, repr=False)

    @property
    def trained(self) -> bool:
        """A vitsinks model (a run's, an import's or a loose checkpoint, edited or not), not a hub model's."""
        return self.hub is None

    def needs_checkpoint(self, what: str, ways: str = "ckpt=, run= or model.pretrained=") -> Path:
        """The vitsinks checkpoint, or a `BadValue` saying that `what` (a command) reads one, given by `ways`."""
        if self.checkpoint is None or not self.trained:
            raise BadValue(f"{what} reads a checkpoint of vitsinks' own model ({ways}), not {self.given}: a hub "
                           f"model is used from its own library")
        return self.checkpoint

    def analyses(self, kind: str, runs_dir: str | Path, claim: bool = True) -> Path:
        """Where the command's `kind` results of this model go; with `claim` the folder is made and recorded."""
        if self.checkpoint is None:
            return hub_dir(str(self.hub), kind, runs_dir, claim)
        return analyses_dir(self.checkpoint, kind, runs_dir, claim)

    def quant_result(self, runs_dir: str | Path) -> dict[str, Any] | None:
        """The W8A8 result `quantize` made of this model, or None. Looks only."""
        if self.checkpoint is not None:
            return quant_result(self.checkpoint, runs_dir)
        try:
            folder = self.analyses("quant", runs_dir, claim=False)
        except BadValue:  # another model's folder: no result of this one
            return None
        path = RunDir(folder).result("quant")
        if not path.is_file():
            return None
        quant = files.read_json(path, f"rerun `python -m vitsinks.quantize hub={self.hub}`")
        return quant if quant.get("checkpoint") == self.hub else None

    def write(self, model: nn.Module | None = None) -> None:
        """Write a pretrained model's import (of `model`, default: built again) before the results; else nothing."""
        if self.plan is not None:
            write_import(self.plan, model if isinstance(model, SinkViT) else None)

    @property
    def recorded(self) -> str:
        """The model as results record it: `ckpt=` as given, else the checkpoint's path or the hub spec."""
        if self.kind == "checkpoint" and self.given.startswith("ckpt="):
            return self.given.removeprefix("ckpt=")
        return str(self.checkpoint) if self.checkpoint is not None else str(self.hub)

    def identity(self) -> str:
        """The model as a cache key part: its checkpoint's or local files' path, size and time, or hub spec."""
        if self.checkpoint is not None:
            return f"{self.checkpoint.resolve()}:{files.stamp(self.checkpoint)}"
        return f"{self.hub}:{_local_stamps(str(self.hub))}"


def _local_stamps(spec: str) -> str:
    """The size and time of the local files a hub spec names (a weights file, a save_pretrained folder's files)."""
    _, _, rest = spec.partition(":")
    name, _, weights = rest.partition("@")
    paths = [Path(p) for p in (name, weights) if p and Path(p).exists()]
    found = [f for p in paths for f in (sorted(p.iterdir()) if p.is_dir() else [p]) if f.is_file()]
    return ",".join(f"{f.name}:{files.stamp(f)}" for f in found)


def given_sources(cfg: DictConfig) -> list[str]:
    """The model sources `cfg` names, as `key=value`, in the order of `MODEL_SOURCES`."""
    return [f"{k}={v}" for k in MODEL_SOURCES if (v := OmegaConf.select(cfg, k, default=None))]


def resolve(cfg: DictConfig, check: bool = True) -> ModelSource:
    """The model `cfg` names, checked (missing files only with `check`); two sources or none is one line."""
    given = given_sources(cfg)
    if len(given) > 1:
        raise BadValue(f"two model sources, {' and '.join(given)}: name the model once, with one of "
                       f"{', '.join(f'{k}=' for k in MODEL_SOURCES)}")
    if not given:
        raise BadValue(f"name the model: ckpt=<checkpoint file>, run=<run folder>, model.pretrained=<timm name or "
                       f"weights file> or hub=<{HUB_SPECS}>")
    if cfg.hub:
        return _hub(str(cfg.hub), given[0])
    if cfg.run:
        return _run(Path(str(cfg.run)).expanduser(), given[0], check)
    if cfg.ckpt:
        return of_checkpoint(Path(str(cfg.ckpt)).expanduser(), given[0], check)
    plan = planned_import(cfg)
    return ModelSource("pretrained", given[0], plan.run.name, plan.run.last, plan.run, plan=plan)


def _hub(spec: str, given: str) -> ModelSource:
    family, sep, rest = spec.partition(":")
    if not sep or family not in LOADERS or not rest:
        raise BadValue(f"hub={spec} names no pretrained model: write {HUB_SPECS}")
    spec = canonical(spec)
    return ModelSource("hub", given, spec, hub=spec)


def _run(path: Path, given: str, check: bool = True) -> ModelSource:
    if check and not path.is_dir():
        raise InputNotFound(f"run={path}: no such folder: name a run folder (runs/<name>, whose checkpoints/last.pt "
                            f"is read)")
    run = RunDir(path)
    found = of_checkpoint(run.last, given, must_exist=False)
    return ModelSource("run", given, found.name, run.last, run, found.hub, found.method)


def of_checkpoint(path: Path, given: str | None = None, must_exist: bool = True) -> ModelSource:
    """The checkpoint file `path` as a source, named `<run>/<stem>` in a run (with a derived run's edit and hub)."""
    if must_exist and not path.is_file():
        raise InputNotFound(f"checkpoint {path} not found")
    run = RunDir.of_checkpoint(path) if in_run(path) else None
    hub = method = None
    if run is not None and run.config.is_file():
        recorded = upgrade(OmegaConf.load(run.config), str(run.config))
        method = recorded.trainfree.method or None
        if method and is_hub_spec(recorded.trainfree.source):
            hub = str(recorded.trainfree.source)
    name = f"{run.name}/{path.stem}" if run is not None else model_name(str(path), "")
    return ModelSource("checkpoint", given or f"ckpt={path}", name, path, run, hub, method)


@dataclass
class Inputs:
    """How pictures become a model's input: its `size` (H, W), normalisation (`mean`, `std`) and, for a hub model,
    the loaded model with its own preprocessing (`own`; None: vitsinks' analysis transform)."""

    size: tuple[int, int]
    mean: tuple[float, ...] = IMAGENET[0]
    std: tuple[float, ...] = IMAGENET[1]
    own: Loaded | None = None

    def transform(self, selection: Any = None) -> Callable[[Any], torch.Tensor]:
        """One picture -> the model's input: its own preprocessing, or the analysis transform of `selection`."""
        if self.own is not None:
            own = self.own
            return lambda im: own.images([im])[0]
        return selection_transform(self.size[0], selection)

    def batch(self, items: list[tuple], selection: Any = None, size: int | None = None
              ) -> tuple[torch.Tensor, np.ndarray]:
        """Dataset items' images as one input batch (at `size`, default the model's) and as the pictures seen."""
        if self.own is None:
            return images_of(items, size or self.size[0], selection)
        x = self.own.images([it[0] for it in items])
        return x, self.own.shown(x)

    @property
    def imagenet(self) -> bool:
        """The model's inputs are normalised with ImageNet's mean and std (vitsinks' own models)."""
        return (self.mean, self.std) == IMAGENET

    def renormalize(self, x: torch.Tensor) -> torch.Tensor:
        """ImageNet-normalised inputs (n, 3, H, W) in this model's normalisation."""
        v = [torch.tensor(t, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
             for t in (*IMAGENET, self.mean, self.std)]
        return (x * v[1] + v[0] - v[2]) / v[3]


@dataclass
class Opened:
    """A model built from its source (`open_model`): `backbone` (the seam), `module` (a `SinkViT` for vitsinks'
    own), `cfg` (the checkpoint's run config, or the command's), `inputs` and `head` (a checkpoint's classifier)."""

    source: ModelSource
    backbone: Backbone
    module: nn.Module
    cfg: DictConfig
    inputs: Inputs
    head: nn.Module | None = None

    def to(self, device: torch.device | str) -> Opened:
        """The model (and the checkpoint's classifier head, if any) on `device`, in place."""
        self.module.to(device)
        if self.head is not None:
            self.head.to(device)
        return self

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are."""
        return next(self.module.parameters()).device

    @property
    def analysis_size(self) -> int:
        """The analyses' image size: a vitsinks run's `views.global_size`, a hub model's input size."""
        return int(self.cfg.views.global_size) if self.inputs.own is None else self.inputs.size[0]

    def batch(self, items: list[tuple], selection: Any = None) -> tuple[torch.Tensor, np.ndarray]:
        """`Inputs.batch` of `items` at the analyses' size."""
        return self.inputs.batch(items, selection, self.analysis_size)

    def pictures(self, dataset: Dataset, n: int, selection: Any, on_bad_image: str = "skip", size: int | None = None
                 ) -> tuple[torch.Tensor, np.ndarray, list[int]]:
        """The first `n` readable images of `dataset` as inputs at `size`, as pictures, and their indices."""
        if self.inputs.own is None:
            return fixed_images(dataset, n, size or self.analysis_size, on_bad_image, selection)
        ((items, index),) = select_items(dataset, [n], selection, on_bad_image, up_to=True)
        return (*self.inputs.batch(items, selection), index)

    def taking_imagenet(self) -> Backbone:
        """The backbone taking ImageNet-normalised inputs (the dense probe's), renormalised first where needed."""
        if self.inputs.imagenet:
            return self.backbone
        embed, renormalize = self.backbone.embed, self.inputs.renormalize
        return replace(self.backbone, embed=lambda x: embed(renormalize(x)))


def open_model(source: ModelSource, cfg: DictConfig) -> Opened:
    """Build the model `source` names, in float32 and evaluation mode (with its edit and head). Writes nothing."""
    if source.hub is not None:
        return _open_hub(source, cfg)
    if source.plan is not None and not source.plan.exists:
        plan = source.plan
        model = model_from_config(plan.cfg.model)
        run_cfg = import_config(plan.cfg, plan.run, model)
        head = None
    else:
        path = source.needs_checkpoint("this")
        if not path.is_file():
            raise InputNotFound(f"checkpoint {path} not found")
        state = load_file(path)
        model, run_cfg = backbone_from_state(state, path, reapply)
        head = classifier_from_state(state["model"]) if model.global_pool == "token" else None
    model = model.float().eval()
    return Opened(source, sinkvit_backbone(model, head), model, run_cfg, Inputs((model.patch_embed.img_size[0],) * 2),
                  head)


def _open_hub(source: ModelSource, cfg: DictConfig) -> Opened:
    """A hub model (`hub=`), or a derived run of one: the hub model loaded again, its recorded edit applied."""
    loaded = load(str(source.hub))
    backbone, run_cfg = adapt(loaded.model), cfg
    if source.method is not None:  # a derived run: the fitted state on the hub model
        path = Path(str(source.checkpoint))
        state = load_file(path)
        if not isinstance(state, dict) or "trainfree" not in state or "config" not in state:
            raise BadValue(f"{path} names the post-hoc edit {source.method} of {source.hub} but holds no fitted "
                           f"state: derive it again (python -m vitsinks.trainfree)")
        run_cfg = upgrade(state["config"], f"the config of {path}")
        backbone = trainfree_method(source.method).apply(backbone, state["trainfree"])
    probe = loaded.transform(Image.new("RGB", (256, 256), (128, 128, 128)))  # a grey picture gives the input size
    inputs = Inputs((int(probe.shape[-2]), int(probe.shape[-1])), loaded.mean, loaded.std, loaded)
    return Opened(source, backbone, loaded.model, run_cfg, inputs)


@dataclass
class Probing:
    """A model set up for the probes (`for_probes`): opened, frozen, on this rank's device, with their data and seed."""

    model: Opened
    data: DictConfig
    seed: int
    runs_dir: str

    def results(self) -> RunDir:
        """The probes' results folder: the model's run (an import is written now), else `<runs_dir>/quant/<model>`."""
        self.model.source.write(self.model.module)
        return RunDir(self.model.source.analyses("quant", self.runs_dir))


def for_probes(cfg: DictConfig, data: DictConfig | None = None) -> Probing:
    """The model of `cfg` for the probes, on this rank's device, with their data (`data` or `pick_data`) and seed."""
    opened = open_model(resolve(cfg), cfg).to(init_distributed(cfg.cluster.device).device)
    opened.module.requires_grad_(False)
    if data is None:
        data = pick_data(cfg.data, opened.cfg.data, data_overrides())
    seed = pick_seed(cfg.seed, opened.cfg.get("seed", cfg.seed), cli_keys())
    return Probing(opened, data, seed, str(cfg.runs_dir))

