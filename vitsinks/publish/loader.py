"""An exported folder (or hub id `<user>/<name>`, downloaded) read back as vitsinks' own model
(`vitsinks.pretrained.load("vitsinks:<folder>")`): the `SinkViT` its `config.json` describes, its weights from
whichever layout the folder holds, and the preprocessing of its `pretrained_cfg`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import hf_hub_download
from omegaconf import OmegaConf
from torchvision import transforms as T

from vitsinks.configs.upgrade import upgrade
from vitsinks.data.selection import analysis_crop
from vitsinks.models import SinkViT, load_timm_state_dict, model_from_config
from vitsinks.models.weights import DAMAGED, check_finite, hub_offline, hub_reachable, load
from vitsinks.publish.timm_format import NAFLEX, VIT, from_timm
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue

CONFIG, WEIGHTS = "config.json", "model.safetensors"
KEY = "vitsinks"  # config.json's key of vitsinks' own model config
OWN = "vitsinks"  # the layout of a folder timm cannot build: vitsinks' own state dict
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass
class Exported:
    """A model read from an exported folder, with its preprocessing, normalisation and `vitsinks` block."""

    model: SinkViT
    transform: Callable[[Any], torch.Tensor]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    info: dict[str, Any]


def folder_of(name: str) -> Path:
    """The local folder `name` names, or the hub repository `name` downloaded (its two files)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if not REPO_ID.match(name):
        raise BadValue(f"vitsinks:{name}: no such folder; name an exported folder (python -m vitsinks.export) or a "
                       f"hub repository <user>/<name>")
    try:
        with hub_offline(not hub_reachable()):  # an unreachable hub: the cache answers at once, no minute of retries
            for filename in (WEIGHTS, CONFIG):
                got = Path(hf_hub_download(name, filename))
    except Exception as err:  # noqa: BLE001 - network, missing repo or file, offline mode: one line each way
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise BadValue(f"vitsinks:{name}: no such folder here, and the hub ({hf_constants.ENDPOINT}) did not give "
                       f"it ({type(err).__name__}: {first[:200]}): check the name, the network or HF_TOKEN") from err
    return got.parent


def read_export(name: str) -> Exported:
    """The model of the exported folder (or hub repository) `name` (see the module docstring)."""
    folder = folder_of(name)
    fix = f"export it again (python -m vitsinks.export ... out={folder})"
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise BadValue(f"vitsinks:{name}: {folder} holds no {CONFIG} and {WEIGHTS}: name a folder "
                       f"python -m vitsinks.export wrote")
    config = files.read_json(folder / CONFIG, fix, "an exported model's config")
    info = config.get(KEY)
    if not isinstance(info, dict) or "model" not in info:
        raise BadValue(f"vitsinks:{name}: {folder / CONFIG} has no `{KEY}` model config: it is not a vitsinks "
                       f"export (a timm folder loads with timm.create_model('local-dir:{folder}', pretrained=True))")
    cfg = upgrade({"model": info["model"]}, f"the model config of {folder / CONFIG}")
    model = model_from_config(OmegaConf.merge(cfg.model, {"pretrained": None}))
    sd = load(folder / WEIGHTS, "weights")
    check_finite(sd, f"{folder / WEIGHTS}", DAMAGED)
    what = f"vitsinks:{name} ({folder / WEIGHTS})"
    layout = info.get("layout", OWN)
    if layout in (VIT, NAFLEX):
        from_timm(model, sd, layout, what)
    elif layout == OWN:
        load_timm_state_dict(model, sd, what=what)
    else:
        raise BadValue(f"{what}: unknown layout {layout!r} in {CONFIG}: export it with this vitsinks version")
    pre = config.get("pretrained_cfg") or {}
    try:
        size, crop_pct = int(pre["input_size"][-1]), float(pre["crop_pct"])
        mean, std = tuple(map(float, pre["mean"])), tuple(map(float, pre["std"]))
        interpolation = str(pre.get("interpolation", "bicubic"))
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise BadValue(f"vitsinks:{name}: {folder / CONFIG}'s pretrained_cfg lacks the preprocessing ({err}): "
                       f"{fix}") from err
    transform = T.Compose([analysis_crop(size, crop_pct, interpolation), T.ToTensor(), T.Normalize(mean, std)])
    return Exported(model.float().eval(), transform, mean, std, info)
