"""`load("timm:NAME")`: a pretrained model of an adapted family by one string, with its own preprocessing.

    timm:<name>[@<file>]        timm.create_model(name, pretrained=True); @file: the weights from a local file
    hf:<hub id or folder>       transformers' AutoModel and AutoImageProcessor (a folder of save_pretrained; one
                                without a processor: the config's image size and ImageNet's mean and std)
    open_clip:<name>@<tag|file> open_clip.create_model_and_transforms(name, pretrained=tag or file)
    vitsinks:<folder or hub id> a folder `python -m vitsinks.export` wrote (or its hub repository)

The model comes in float32 and evaluation mode, unmodified, with the library's evaluation `transform` and its
`mean` / `std`; a library is imported only when its family is asked for. Errors answer as `model.pretrained=` does.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from vitsinks.models.weights import DAMAGED, WEIGHT_SUFFIXES, check_finite, hub_or_cache, misfit, state_dict_from_file
from vitsinks.models.weights import load as load_weights
from vitsinks.publish.loader import read_export
from vitsinks.utils.errors import BadValue, InputNotFound
from vitsinks.utils.rundir import model_folder, model_folder_path


@dataclass
class Loaded:
    """A loaded pretrained model (`load`), its evaluation transform and normalisation; `spec` names it."""

    spec: str
    model: nn.Module
    transform: Callable[[Any], torch.Tensor]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def shown(self, images: torch.Tensor) -> np.ndarray:
        """Normalised images (n, 3, H, W) back as uint8 RGB (n, H, W, 3): what the model saw."""
        mean = torch.tensor(self.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.std).view(1, -1, 1, 1)
        x = (images.detach().float().cpu() * std + mean).clamp(0, 1)
        return (x.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)

    def images(self, pil_images: list[Any]) -> torch.Tensor:
        """PIL images through the model's transform, as one batch (RGB first); a `BadValue` for anything else."""
        wrong = [type(im).__name__ for im in pil_images if not isinstance(im, Image.Image)]
        if wrong:
            raise BadValue(f"{self.spec} takes PIL images through its own preprocessing, got a {wrong[0]}: use a "
                           f"dataset of pictures (data=imagenet, fashion_mnist, ...)")
        return torch.stack([self.transform(im.convert("RGB")) for im in pil_images])


def _first_line(e: BaseException) -> str:
    """An exception's message, first line only (hub errors carry long request dumps)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _library(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise BadValue(f"{module} is not installed ({e}): pip install 'vitsinks[{extra}]'") from e


def _readable(path: Path, spec: str) -> None:
    """A local weights file read weights-only before the library loads it (`models.weights.load`): a file that would
    run code, or is not weights, is one line, never unpickled."""
    if not path.is_file():
        raise BadValue(f"{spec}: no such weights file")
    load_weights(path, "weights", mmap=True)


def _hub(what: str, fix: str, remote: bool) -> AbstractContextManager[None]:
    """`models.weights.hub_or_cache` for what comes from the hub (`remote`); a local file or folder needs none."""
    return hub_or_cache(what, fix) if remote else nullcontext()


@contextmanager
def _quiet() -> Iterator[None]:
    """The libraries' log lines held back (open_clip warns of the random weights of the model `_misfit` compares to)."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def _not_fitting(e: BaseException) -> bool:
    """Whether `e` is torch's refusal of a state dict that does not fit the model (`load_state_dict`)."""
    return isinstance(e, RuntimeError) and str(e).startswith("Error(s) in loading state_dict")


def _misfit(what: str, path: Path, model: nn.Module, fix: str) -> str | None:
    """The line for a weights file that does not load into `model` (a fresh one of the name asked for,
    `models.weights.misfit`); None when the file's tensors do fit (the library failed for another reason)."""
    sd, own = state_dict_from_file(path), model.state_dict()
    if all(k in own and tuple(v.shape) == tuple(own[k].shape) for k, v in sd.items()) and own.keys() <= sd.keys():
        return None
    blocks = getattr(model, "blocks", None)
    heads = getattr(getattr(blocks[0], "attn", None), "num_heads", None) if blocks else None
    return misfit(what, sd, own, fix, heads)


def _timm(name: str, weights: str | None) -> Loaded:
    timm = _library("timm", "dev")
    from timm.data import create_transform, resolve_data_config

    if weights is not None:
        _readable(Path(weights).expanduser(), f"timm:{name}@{weights}")
    overlay = {"file": str(Path(weights).expanduser())} if weights else None
    with _hub(f"timm:{name}", f"pass a weights file, timm:{name}@<file>", remote=weights is None):
        try:
            model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay)
        except (RuntimeError, OSError, ValueError) as e:  # an unknown name; weights neither cached nor downloadable
            if weights is not None and _not_fitting(e) and (why := _misfit(
                    f"timm:{name}@{weights}", Path(weights).expanduser(), timm.create_model(name),
                    f"name the timm model of the file's architecture, timm:<name>@{weights}")):
                raise BadValue(why) from e
            raise BadValue(f"timm:{name}: {_first_line(e)}") from e
    cfg = resolve_data_config({}, model=model)
    return Loaded(f"timm:{name}", model, create_transform(**cfg), tuple(cfg["mean"]), tuple(cfg["std"]))


ANNOUNCED: set[str] = set()  # the save_pretrained folders whose assumed processor this process announced


def _assumed_processor(transformers: Any, folder: str, config: Any) -> Any:
    """The processor of a save_pretrained folder that holds the model alone: a `ViTImageProcessor` resizing to the
    config's (or its `vision_config`'s) `image_size` with ImageNet's mean and std, announced once per folder."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    size = next((s for c in (config, getattr(config, "vision_config", None)) if (s := getattr(c, "image_size", None))),
                None)
    if size is None:
        raise BadValue(f"hf:{folder}: no image processor beside the model and no image_size in its config: save the "
                       f"model's processor there, processor.save_pretrained({folder!r})")
    h, w = (size, size) if isinstance(size, int) else size
    if folder not in ANNOUNCED:  # once per process: a command may load the model more than once
        ANNOUNCED.add(folder)
        print(f"hf:{folder}: no image processor saved beside the model: resizing to its config's image size, {h}x{w} "
              f"px (height x width), and normalising with ImageNet's mean and std; to use the model's own, save it "
              f"there: processor.save_pretrained({folder!r})", flush=True)
    return transformers.ViTImageProcessor(size={"height": h, "width": w}, image_mean=list(IMAGENET_DEFAULT_MEAN),
                                          image_std=list(IMAGENET_DEFAULT_STD))


def _check_folder(name: str) -> None:
    """An `hf:` name written as a path that is no folder: an `InputNotFound` naming it, not advice about hub ids."""
    path = Path(name).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise BadValue(f"hf:{name} is a file, not a folder: name the folder save_pretrained wrote (config.json "
                       f"and the weights), or a hub id <namespace>/<name>")
    if name.startswith(("./", "../", "/", "~")) or name in (".", "..") or (
            path.parent != Path(".") and path.parent.is_dir()):
        raise InputNotFound(f"hf:{name}: no such folder: check the path (a folder save_pretrained wrote), or name a "
                            f"hub id <namespace>/<name>")


def _hf(name: str, weights: str | None) -> Loaded:
    if weights is not None:
        raise BadValue(f"hf:{name}@{weights}: a transformers model is a hub id or a save_pretrained folder, no @")
    _check_folder(name)
    transformers = _library("transformers", "hf")
    with _hub(f"hf:{name}", "pass a save_pretrained folder, hf:<folder>", remote=not Path(name).is_dir()):
        try:
            model = transformers.AutoModel.from_pretrained(name, trust_remote_code=False)  # never a folder's own code
        except (OSError, ValueError) as e:  # an unknown id; files neither cached nor downloadable
            raise BadValue(f"hf:{name}: {_first_line(e)}") from e
        try:
            proc = transformers.AutoImageProcessor.from_pretrained(name, trust_remote_code=False)
        except (OSError, ValueError) as e:
            saved = (transformers.utils.IMAGE_PROCESSOR_NAME, transformers.utils.PROCESSOR_NAME)
            if not Path(name).is_dir() or any((Path(name) / f).exists() for f in saved):  # a hub id; a broken file
                raise BadValue(f"hf:{name}: {_first_line(e)}") from e
            proc = _assumed_processor(transformers, name, model.config)  # save_pretrained of the model alone

    def transform(image: Any) -> torch.Tensor:
        return proc(image, return_tensors="pt")["pixel_values"][0]

    return Loaded(f"hf:{name}", model, transform, tuple(proc.image_mean), tuple(proc.image_std))


def _random_open_clip(open_clip: Any, name: str) -> nn.Module:
    with _quiet():
        return open_clip.create_model(name)


def _open_clip(name: str, weights: str | None) -> Loaded:
    open_clip = _library("open_clip", "clip")
    if weights is None:
        raise BadValue(f"open_clip:{name}: name its weights, open_clip:{name}@<tag> (open_clip.list_pretrained()) "
                       f"or @<file>")
    spec, path = f"open_clip:{name}@{weights}", Path(weights).expanduser()
    local = path.is_file()  # a local file, not a tag
    if local:
        _readable(path, spec)
    elif Path(weights).suffix in WEIGHT_SUFFIXES or "/" in weights:  # a file meant (tags have neither)
        raise BadValue(f"{spec}: no such weights file")
    with _hub(spec, f"pass a weights file, open_clip:{name}@<file>", remote=not local):
        try:
            if not local and (tagged := open_clip.get_pretrained_cfg(name, weights)):
                open_clip.download_pretrained(tagged)  # the cache's answer first (open_clip would log a failure)
            model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=weights)
        except (RuntimeError, OSError, ValueError) as e:  # an unknown name or tag; weights not downloadable
            if local and _not_fitting(e) and (why := _misfit(
                    spec, path, _random_open_clip(open_clip, name),
                    f"name the open_clip model of the file's architecture, open_clip:<name>@{weights}")):
                raise BadValue(why) from e
            raise BadValue(f"{spec}: {_first_line(e)}") from e
    cfg = open_clip.get_model_preprocess_cfg(model)
    return Loaded(f"open_clip:{name}@{weights}", model, preprocess, tuple(cfg["mean"]), tuple(cfg["std"]))


def _vitsinks(name: str, weights: str | None) -> Loaded:
    if weights is not None:
        raise BadValue(f"vitsinks:{name}@{weights}: an exported model is a folder or a hub id, no @")
    e = read_export(name)
    return Loaded(f"vitsinks:{name}", e.model, e.transform, e.mean, e.std)


def canonical(spec: str) -> str:
    """`spec` with a local weights file or save_pretrained folder as its absolute path (what `Loaded.spec` holds)."""
    family, _, rest = spec.partition(":")
    name, at, weights = rest.partition("@")
    if at and Path(weights).expanduser().is_file():
        weights = str(Path(weights).expanduser().resolve())
    if family in ("hf", "vitsinks") and Path(name).expanduser().is_dir():
        name = str(Path(name).expanduser().resolve())
    return f"{family}:{name}{at}{weights}"


def folder_name(spec: str) -> str:
    """A file name for the outputs of the model `spec` names (`canonical`: local files as absolute paths): `:` and
    `/` as `_`, a weights file by its stem, a save_pretrained folder by its name."""
    family, _, rest = spec.partition(":")
    name, at, weights = rest.partition("@")
    if at and Path(weights).is_absolute():  # a weights file (`canonical`), not a tag
        weights = Path(weights).stem
    if Path(name).is_absolute():
        name = Path(name).name
    return f"{family}_{name}{at}{weights}".replace("/", "_").replace(":", "_")


def hub_dir(spec: str, kind: str, runs_dir: str | Path, claim: bool = True) -> Path:
    """`<runs_dir>/<kind>/<folder_name>`: where the commands' `hub=` route writes a model's `kind` analyses, recording
    the model (`utils.rundir.model_folder`: another model's is refused; without `claim`, it only looks)."""
    spec = canonical(spec)
    return (model_folder if claim else model_folder_path)(Path(runs_dir) / kind, spec, spec, folder_name(spec))


LOADERS: dict[str, Callable[[str, str | None], Loaded]] = {"timm": _timm, "hf": _hf, "open_clip": _open_clip,
                                                           "vitsinks": _vitsinks}


def load(spec: str) -> Loaded:
    """The pretrained model that `spec` names (see the module docstring), float32, in evaluation mode."""
    family, sep, rest = spec.partition(":")
    if not sep or family not in LOADERS or not rest:
        raise BadValue(f"{spec!r} names no pretrained model: write {' or '.join(f'{f}:<name>' for f in LOADERS)}")
    name, at, weights = rest.partition("@")
    loaded = LOADERS[family](name, weights if at else None)
    check_finite({k: p.detach() for k, p in loaded.model.named_parameters()}, spec, DAMAGED)
    loaded.spec = canonical(spec)
    loaded.model = loaded.model.float().eval()
    return loaded


__all__ = ["LOADERS", "Loaded", "canonical", "folder_name", "hub_dir", "load"]
