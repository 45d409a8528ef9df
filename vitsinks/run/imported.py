"""A pretrained model (`model.pretrained=` a timm name or a weights file) imported as a run (docs/commands.md):
`<runs_dir>/<model>/` with `config.yaml`, `checkpoints/last.pt` (the weights), `source.json` (what made them) and
`status.json`, so that every command reads it as a trained run. `planned_import` says where it is, writing nothing;
`write_import` writes it (a hidden folder renamed into place). A folder of that name made of anything else is refused.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.schema import exp_names, to_container
from vitsinks.configs.upgrade import saved, upgrade
from vitsinks.models import ATTN_KINDS, SinkViT, model_from_config
from vitsinks.train.checkpoint import arch_of, save_state
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import SOURCE, RunDir, in_run, model_name

RESERVED = ("diagnostics", "interventions", "quant", "sweeps", "slurm_logs")  # the runs folder's own folders


def names_a_variant(name: str) -> bool:
    """`name` reads as a variant's (`reg`, `softpick+reg`, `global+pen`): its rows would merge with that variant's."""
    parts = {p for e in exp_names() for p in e.split("+")} | set(ATTN_KINDS) | {"pen"}
    return all(p in parts for p in name.split("+"))


def with_tag(source: str) -> str:
    """A timm name with the tag of the weights timm would load for it (one import per model); a file, a hub name
    or an untagged name unchanged."""
    if Path(source).expanduser().is_file() or ":" in source:
        return source
    source = source.removeprefix("timm/")  # timm reads `timm/<name>` as `<name>`
    source = timm.models.get_deprecated_models().get(source) or source  # as timm maps a deprecated alias
    if "." in source:
        return source
    pretrained = timm.models.get_pretrained_cfg(source)
    tag = getattr(pretrained, "tag", None) if pretrained is not None else None
    return f"{source}.{tag}" if tag else source


def import_key(cfg: DictConfig) -> dict[str, Any]:
    """What determines an import's weights: the source (a file by path, size and time), the architecture."""
    source, version = str(cfg.model.pretrained), None
    path = Path(source).expanduser()
    if path.is_file():
        source, version = str(path.resolve()), files.stamp(path)
    return {"source": source, "version": version, "model": arch_of(to_container(cfg.model))}


def _same_file(run: RunDir, held: dict[str, Any], key: dict[str, Any]) -> bool:
    """`run` was imported from `key`'s source: the same name and stamp, or a file with the same bytes."""
    if (held.get("source"), held.get("version")) == (key["source"], key["version"]):
        return True
    digest = json.loads((run.path / SOURCE).read_text()).get("sha256")
    return key["version"] is not None and digest is not None and files.sha256(key["source"]) == digest


def _refusal(run: RunDir, key: dict[str, Any]) -> str | None:
    """Why the folder `run` cannot be this import, and the way out; None when it is this import."""
    held = _import_record(run)
    if held is None:
        if not run.config.is_file():
            return f"{run.path} holds no import (no {SOURCE}): delete that folder, or give this model another runs_dir="
        return f"{run.path} is a run, not an import of {key['source']}: give this model another runs_dir="
    if not _same_file(run, held, key):
        what = (f"the import of {held.get('source')}" if held.get("source") != key["source"] else
                "the import of an earlier version of that file (it has changed since)")
    elif held.get("model") != key["model"]:
        there = held.get("model", {})
        diff = ", ".join(f"{k}: {there.get(k)!r} there vs {key['model'].get(k)!r}"
                         for k in sorted(set(there) | set(key["model"])) if key["model"].get(k) != there.get(k))
        what = f"its import with other architecture settings ({diff})"
    elif not run.last.is_file():
        what = "its import without checkpoints/last.pt"
    else:
        return None
    return f"{run.path} holds {what}: delete that folder, or give this model another runs_dir="


def import_config(cfg: DictConfig, run: RunDir, model: SinkViT) -> DictConfig:
    """The run config the import `run` holds of `cfg.model.pretrained` built as `model`."""
    return upgrade({"name": run.name, "runs_dir": str(run.path.parent), "exp": cfg.exp, "seed": cfg.seed,
                    "imported": run.name, "data": to_container(cfg.data),
                    "model": {**to_container(cfg.model), "pretrained": None},
                    "views": {"global_size": model.patch_embed.img_size[0]}})


def _make(cfg: DictConfig, run: RunDir, key: dict[str, Any], model: SinkViT | None = None) -> None:
    """Write the import of `model` (default: built now) into a hidden folder and rename it into place."""
    model = model if model is not None else model_from_config(cfg.model)
    tmp = RunDir(run.path.parent / f".{run.name}.import-{secrets.token_hex(4)}")
    run_cfg = import_config(cfg, run, model)
    try:
        tmp.start(saved(run_cfg))
        save_state({"config": saved(run_cfg), "model": model.state_dict()}, tmp.last)
        digest = files.sha256(key["source"]) if key["version"] is not None else None  # a file's bytes
        files.write_json(tmp.path / SOURCE, {**key, "sha256": digest, "timm": timm.__version__})
        tmp.write_status("finished", imported_from=str(cfg.model.pretrained))
        try:
            os.rename(tmp.path, run.path)
        except OSError:  # another process's import (or a run) is there now
            if not run.path.exists():
                raise
            if (refused := _refusal(run, key)) is not None:
                raise BadValue(refused) from None
    finally:
        shutil.rmtree(tmp.path, ignore_errors=True)


def _import_record(run: RunDir) -> dict[str, Any] | None:
    """The key an import's folder records (without the file's hash and the timm version), or None."""
    if not (run.path / SOURCE).is_file():
        return None
    return {k: v for k, v in json.loads((run.path / SOURCE).read_text()).items() if k not in ("timm", "sha256")}


@dataclass(frozen=True)
class PlannedImport:
    """Where an import is, what determines its weights, the config with the tagged source, whether it exists."""

    run: RunDir
    key: dict[str, Any]
    cfg: DictConfig
    exists: bool


def planned_import(cfg: DictConfig) -> PlannedImport:
    """The import of `cfg.model.pretrained` under `cfg.runs_dir`, or a one-line refusal. Looks only."""
    if not cfg.model.pretrained:
        raise BadValue("name the pretrained model: model.pretrained=<timm name or weights file>")
    source = Path(cfg.model.pretrained).expanduser()
    if in_run(source) and source.is_file() and RunDir.of_checkpoint(source).config.is_file():
        raise BadValue(f"model.pretrained={cfg.model.pretrained} is a run's checkpoint, not weights to import: "
                       f"read it with ckpt={cfg.model.pretrained}")
    tagged = with_tag(str(cfg.model.pretrained))
    cfg = OmegaConf.merge(cfg, {"model": {"pretrained": tagged}})  # type: ignore[assignment]
    name = model_name(str(cfg.model.pretrained), str(cfg.name))
    if names_a_variant(name) or name in RESERVED:
        raise BadValue(f"model.pretrained={cfg.model.pretrained} would be imported as '{name}', which names "
                       f"{'a variant' if names_a_variant(name) else 'a folder of the runs folder'}: rename the file")
    run, key = RunDir(Path(cfg.runs_dir) / name), import_key(cfg)
    if run.path.exists() and (refused := _refusal(run, key)) is not None:
        raise BadValue(refused)
    return PlannedImport(run, key, cfg, run.path.exists())


def write_import(plan: PlannedImport, model: SinkViT | None = None) -> RunDir:
    """The import `plan` names, written now from `model` (default: built) unless it is there."""
    run, key, cfg = plan.run, plan.key, plan.cfg
    if not run.path.exists():
        run.path.parent.mkdir(parents=True, exist_ok=True)
        _make(cfg, run, key, model)
        print(f"imported {cfg.model.pretrained} as the run {run.path}")
    elif (refused := _refusal(run, key)) is not None:
        raise BadValue(refused)
    else:
        held = json.loads((run.path / SOURCE).read_text())
        if (held.get("source"), held.get("version")) != (key["source"], key["version"]):
            files.write_json(run.path / SOURCE, {**held, **key})  # the file moved: where it is now, hashed no more
        print(f"reading {cfg.model.pretrained} from its import {run.path}")
    return run


def imported_run(cfg: DictConfig) -> RunDir:
    """The run of `cfg.model.pretrained` under `cfg.runs_dir`, imported now or read from an earlier import."""
    return write_import(planned_import(cfg))
