"""The exported folder and its upload (docs/export.md).

`write_folder` stages `model.safetensors`, `config.json` and the card `README.md` beside `out`, then moves them into
place: a new folder whole; into an empty folder or over an earlier export of the same checkpoint (by SHA-256), file
by file, every other file left alone. Any other folder is refused. `push` uploads it through `huggingface_hub`; a
missing token, a refusal or an unreachable hub is one line, and the folder stays.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import tempfile
from pathlib import Path
from typing import Any

import safetensors.torch
import timm
import torch
from huggingface_hub import HfApi, get_token
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import HfHubHTTPError
from omegaconf import DictConfig

from vitsinks.configs.schema import to_container
from vitsinks.configs.upgrade import saved
from vitsinks.data.selection import IMAGENET_NORMALIZE
from vitsinks.models import run_variant
from vitsinks.publish import card, facts
from vitsinks.publish.loader import CONFIG, KEY, OWN, WEIGHTS
from vitsinks.publish.provenance import Source, checkpoint_path, read
from vitsinks.publish.timm_format import CHECK_IMAGES, check_equal, to_timm, unmappable
from vitsinks.utils import files
from vitsinks.utils.errors import BadFile, BadValue

CARD = "README.md"
FILES = (WEIGHTS, CONFIG, CARD)  # what an export writes (and uploads); nothing else in its folder is touched
# what a run's config says about this machine, not the model: left out of the folder's copy
MACHINE = ("runs_dir", "ckpt", "run", "hub", "cluster", "wandb", "export")
MACHINE_PATHS = ("data.root", "data.file_list_cache", "eval.dense_root")
# huggingface_hub's HTTP library's base error (connection refused, timeout)
TRANSPORT: type[Exception] = HfHubHTTPError.__bases__[0]


def preprocessing(source: Source) -> dict[str, Any]:
    """The model's evaluation preprocessing as timm's `pretrained_cfg` names it."""
    size = source.model.patch_embed.img_size
    return {"input_size": [source.model.patch_embed.proj.in_channels, *size],
            "crop_pct": float(source.cfg.selection.crop_pct), "crop_mode": "center",
            "interpolation": str(source.cfg.selection.interpolation),
            "mean": list(IMAGENET_NORMALIZE["mean"]), "std": list(IMAGENET_NORMALIZE["std"])}


def run_settings(cfg: DictConfig) -> dict[str, Any]:
    """The run's resolved config without what names this machine (`MACHINE`, `MACHINE_PATHS`)."""
    tree = {k: v for k, v in saved(cfg).items() if k not in MACHINE}
    for key in MACHINE_PATHS:
        group, name = key.split(".")
        if isinstance(tree.get(group), dict) and name in tree[group]:
            tree[group][name] = None
    return tree


def versions() -> dict[str, str]:
    out = {"timm": timm.__version__, "torch": torch.__version__}
    try:
        out["vitsinks"] = importlib.metadata.version(card.PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pass
    return out


def info_block(source: Source, layout: str) -> dict[str, Any]:
    """config.json's `vitsinks` block: layout, model config, variant, source checkpoint, run settings."""
    model = {**to_container(source.cfg.model), "pretrained": None}
    src = {"run": source.run.name if source.run is not None else None, "checkpoint": source.ckpt.name,
           "step": source.step, "epoch": source.epoch, "sha256": source.sha256}
    return {"layout": layout, "variant": run_variant(source.cfg), "model": model, "source": src,
            "versions": versions(), "run_config": run_settings(source.cfg)}


def held_export(out: Path) -> dict[str, Any] | None:
    """The `vitsinks` block of the export in folder `out` (None: no readable export there)."""
    try:
        block = files.read_json(out / CONFIG, "").get(KEY)
    except (OSError, BadFile):
        return None
    return block if isinstance(block, dict) else None


def claim(out: Path, sha256: str) -> bool:
    """Whether `out` holds an earlier export of this checkpoint (True) or is new or empty (False); else `BadValue`."""
    if out.exists() and not out.is_dir():
        raise BadValue(f"out={out} is a file: name a new or empty folder")
    if not out.exists() or not any(out.iterdir()):
        return False
    held = held_export(out)
    if held is None:
        raise BadValue(f"out={out} is not empty and holds no vitsinks export: name a new or empty folder (nothing "
                       f"was written)")
    if (held.get("source") or {}).get("sha256") != sha256:
        src = held.get("source") or {}
        raise BadValue(f"out={out} holds the export of another checkpoint ({src.get('run')}/{src.get('checkpoint')}, "
                       f"step {src.get('step')}): name a new or empty folder (nothing was written)")
    return True


def _write(stage: Path, weights: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """`model.safetensors` (`safetensors.torch.save_file`) and `config.json` into `stage`."""
    safetensors.torch.save_file({k: v.detach().contiguous() for k, v in weights.items()}, stage / WEIGHTS,
                                metadata={"format": "pt"})
    files.write_json(stage / CONFIG, config)


def hub_config(source: Source, pre: dict[str, Any], license_: str, block: dict[str, Any],
               architecture: str | None = None, model_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json in the layout of timm's hub folders, vitsinks' block under `KEY`."""
    timm_part = {"architecture": architecture} if architecture else {}
    pretrained = {**pre, "fixed_input_size": False, "license": license_, "num_classes": 0}
    if architecture:
        default = timm.models.get_pretrained_cfg(architecture)  # where the builder's first conv and head sit
        pretrained.update(first_conv=getattr(default, "first_conv", None), classifier=getattr(default, "classifier",
                                                                                               None))
    return {**timm_part, "num_classes": 0, "num_features": source.model.embed_dim, "global_pool": "token",
            **({"model_args": model_args} if model_args else {}), "pretrained_cfg": pretrained, KEY: block}


def _write_timm(source: Source, stage: Path, pre: dict[str, Any], license_: str) -> card.Export:
    """The timm layout into `stage`, after the check that timm's model computes vitsinks' features."""
    tm = to_timm(source.model, str(source.cfg.model.size), source.cfg.model.layerscale_init)
    timm_model = tm.build()
    diff = check_equal(source.model, timm_model)
    block = {**info_block(source, tm.layout), "check": {"images": CHECK_IMAGES, "max_abs_diff": diff}}
    _write(stage, timm_model.state_dict(), hub_config(source, pre, license_, block, tm.architecture, tm.model_args))
    return card.Export(tm.layout, "", False, pre, license_, tm.architecture, diff, CHECK_IMAGES)


def _write_own(source: Source, stage: Path, pre: dict[str, Any], license_: str, reasons: list[str]) -> card.Export:
    """vitsinks' layout into `stage`."""
    block = {**info_block(source, OWN), "not_timm": reasons}
    _write(stage, source.model.state_dict(), hub_config(source, pre, license_, block))
    return card.Export(OWN, "", False, pre, license_, reasons=reasons)


def move_into(stage: Path, out: Path, whole: bool) -> None:
    """The staged files into `out`: the staging folder renamed into place (`whole`), else file by file."""
    with files.faults_named(out):
        umask = os.umask(0)  # the umask's modes, not the private ones of temp files
        os.umask(umask)
        stage.chmod(0o777 & ~umask)
        for name in FILES:
            (stage / name).chmod(0o666 & ~umask)
        if whole:
            os.rename(stage, out)
            return
        for name in FILES:
            os.replace(stage / name, out / name)


def write_folder(cfg: DictConfig) -> tuple[Path, facts.Facts, card.Export]:
    """Export `cfg.ckpt` (or `cfg.run`'s) into `cfg.export.out`; returns the folder, the facts, the export."""
    path = checkpoint_path(cfg.ckpt, cfg.run)
    if not cfg.export.out:
        raise BadValue("name the folder to write: out=<folder> (new or empty)")
    if cfg.export.push and not cfg.export.repo:
        raise BadValue("push=true needs the hub repository: repo=<user or organisation>/<name>")
    out = Path(str(cfg.export.out)).expanduser()
    source = read(path)
    again = claim(out, source.sha256)
    license_ = str(cfg.export.license or card.package_license())
    pre = preprocessing(source)
    with files.faults_named(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", suffix=files.TMP_SUFFIX, dir=out.parent))
    try:
        reasons = unmappable(source.model)
        export = _write_own(source, stage, pre, license_, reasons) if reasons else \
            _write_timm(source, stage, pre, license_)
        repo = str(cfg.export.repo) if cfg.export.repo else None
        export = dataclasses.replace(export, where=repo or str(out), on_hub=repo is not None)
        found = facts.gather(source)
        files.write_text(stage / CARD, card.render(found, export))
        move_into(stage, out, whole=not out.exists())
    finally:
        if stage.exists():  # a failure, or the files moved one by one (an empty folder, an earlier export)
            files.remove(stage)
    if again:
        print(f"replaced the earlier export of this checkpoint in {out}")
    return out, found, export


def push(out: Path, repo: str, private: bool = False, message: str = "vitsinks export",
         api: HfApi | None = None) -> str:
    """Upload the export in `out` to the hub repository `repo`; returns the commit's URL. A failure is one line."""
    api = api or HfApi()
    endpoint = api.endpoint or hf_constants.ENDPOINT
    kept = f"the folder {out} is kept: push it later with python -m vitsinks.export ... out={out} push=true repo={repo}"
    if not (api.token or get_token()):
        raise BadValue(f"no Hugging Face token to upload to {endpoint}: log in with `hf auth login` (or set HF_TOKEN "
                       f"to a token with write access); {kept}")
    try:
        url = api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=url.repo_id, folder_path=str(out), allow_patterns=list(FILES),
                                   commit_message=message)
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else "?"
        first = (str(err).strip().splitlines() or [""])[0][:200]
        fix = ("log in with `hf auth login` or set HF_TOKEN to a token that may write there" if status in (401, 403)
               else "check the repository name")
        raise BadValue(f"the hub at {endpoint} refused {repo} (HTTP {status}: {first}): {fix}; {kept}") from err
    except (TRANSPORT, OSError) as err:
        raise BadValue(f"the hub at {endpoint} cannot be reached ({type(err).__name__}: {err}): check the network, "
                       f"or HF_ENDPOINT; {kept}") from err
    return str(commit.commit_url if hasattr(commit, "commit_url") else commit)
