"""A pretrained model (`model.pretrained=` a timm name or a weights file) imported as a run, so that every command
reads it as it reads a trained run's checkpoint and the leaderboard tabulates it beside the trained variants:

    <runs_dir>/<model>/config.yaml          the command's config: `imported` names the model, `model.pretrained` is
                                            cleared (the weights are in the checkpoint)
                       checkpoints/last.pt  the backbone's weights (no training state)
                       source.json          what made the weights: the source (a file with its size and time) and
                                            the model settings
                       status.json          finished, with `imported_from`

`<model>` is `utils.rundir.model_name`'s. The import is made on first use and read after; a folder of that name made
of anything else (another file of the same name, other model settings, a trained run) is refused, never replaced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.schema import to_container
from vitsinks.models import model_from_config
from vitsinks.train.checkpoint import save_state
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import SOURCE, RunDir, model_name


def import_key(cfg: DictConfig) -> dict[str, Any]:
    """Everything that determines an import's weights: the source (a file by its absolute path, with its size and
    modification time, so that a rewritten file is a new model) and the model settings."""
    source, version = str(cfg.model.pretrained), None
    path = Path(source).expanduser()
    if path.is_file():
        source, version = str(path.resolve()), f"{path.stat().st_size}:{path.stat().st_mtime_ns}"
    return {"source": source, "version": version,
            "model": to_container(OmegaConf.merge(cfg.model, {"pretrained": None}))}


def imported_run(cfg: DictConfig) -> RunDir:
    """The run of `cfg.model.pretrained` under `cfg.runs_dir`, imported now or read from an earlier import of the
    same source with the same model settings."""
    if not cfg.model.pretrained:
        raise BadValue("name the model: ckpt=runs/<name>/checkpoints/last.pt or model.pretrained=<timm name or file>")
    name = model_name(str(cfg.model.pretrained), str(cfg.name))
    run, key = RunDir(Path(cfg.runs_dir) / name), import_key(cfg)
    record = run.path / SOURCE
    if run.path.exists():
        held = json.loads(record.read_text()) if record.is_file() else None
        if held == key and run.last.is_file():
            return run
        what = ("a run, not an import of it" if held is None
                else f"the import of {held.get('source')}" if held.get("source") != key["source"]
                else "the import of an earlier version of that file" if held.get("version") != key["version"]
                else "its import with other model settings" if held.get("model") != key["model"]
                else "an unfinished import of it")
        raise BadValue(f"{run.path} holds {what}: delete that folder, or give this model another runs_dir=")
    model = model_from_config(cfg.model)
    run_cfg = OmegaConf.merge(cfg, {"name": name, "runs_dir": str(run.path.parent), "imported": name,
                                    "ckpt": None, "run": None, "model": {"pretrained": None},
                                    "trainfree": {"method": None, "source": None},  # the command's edit is not its
                                    "views": {"global_size": model.patch_embed.img_size[0]}})
    run.lock()
    try:
        run.start(run_cfg)
        save_state({"config": to_container(run_cfg), "model": model.state_dict()}, run.last)
        files.write_json(record, key)  # last: a folder without it was not finished, and is refused
        run.write_status("finished", imported_from=str(cfg.model.pretrained))
    finally:
        run.unlock()
    print(f"imported {cfg.model.pretrained} as {run.path}")
    return run


def checkpoint_of(cfg: DictConfig) -> Path:
    """The checkpoint a command reads: `ckpt=`, else the import of `model.pretrained=` (`imported_run`), made in
    one process (several ranks would race to write it)."""
    if cfg.ckpt:
        return Path(cfg.ckpt)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and cfg.model.pretrained:
        raise BadValue(f"{cfg.model.pretrained} is imported in one process: run this command once without torchrun "
                       f"(or any of diagnose / quantize / trainfree on it), then pass ckpt=<runs_dir>/<model>/"
                       f"checkpoints/last.pt")
    return imported_run(cfg).last


def with_checkpoint(cfg: DictConfig) -> DictConfig:
    """`cfg` with `ckpt` set to `checkpoint_of(cfg)`: the commands that read `cfg.ckpt` then read a pretrained
    model's import as any checkpoint."""
    return cfg if cfg.ckpt else OmegaConf.merge(cfg, {"ckpt": str(checkpoint_of(cfg))})  # type: ignore[return-value]
