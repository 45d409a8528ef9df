"""What an export reads: a checkpoint (`ckpt=`, or `run=`'s `last.pt`), its backbone, run config, step and run. A
derived run (its edit runs as hooks a weights file cannot carry) and an imported pretrained model are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from vitsinks.configs.upgrade import upgrade
from vitsinks.models import SinkViT
from vitsinks.models.weights import load
from vitsinks.posthoc import method as trainfree_method
from vitsinks.train.checkpoint import backbone_from_state
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue, InputNotFound
from vitsinks.utils.rundir import RunDir, in_run


@dataclass
class Source:
    """A checkpoint to export: file, backbone, run config, step, epoch, run (None: a loose file), SHA-256."""

    ckpt: Path
    model: SinkViT
    cfg: DictConfig
    step: int | None
    epoch: int | None
    run: RunDir | None
    sha256: str

    @property
    def stem(self) -> str:
        """The checkpoint's name in its run (`last`, `step_0000100`): its analyses' folder name."""
        return self.ckpt.stem


def checkpoint_path(ckpt: str | None, run: str | None) -> Path:
    """The checkpoint `ckpt=` names, or `run=`'s `checkpoints/last.pt`; one of the two, and it must exist."""
    if bool(ckpt) == bool(run):
        raise BadValue("name what to export, one of ckpt=<checkpoint file> or run=<run folder> (its last checkpoint)")
    if run:
        rd = RunDir(Path(run).expanduser())
        if not rd.last.is_file():
            raise InputNotFound(f"run={run} has no checkpoints/last.pt: name a run folder (runs/<name>) that has "
                                f"finished at least one epoch, or pass ckpt=<checkpoint file>")
        return rd.last
    path = Path(str(ckpt)).expanduser()
    if not path.is_file():
        raise InputNotFound(f"ckpt={ckpt}: no such checkpoint file (runs/<name>/checkpoints/last.pt)")
    return path


def read(path: Path) -> Source:
    """The checkpoint at `path`; a derived run or an import is a `BadValue` saying what to export instead."""
    state = load(path)
    if not isinstance(state, dict) or "config" not in state:
        raise BadValue(f"{path} is not a vitsinks training checkpoint (no config inside): pass "
                       f"runs/<name>/checkpoints/last.pt")
    cfg = upgrade(state["config"], f"the config of checkpoint {path}")
    if cfg.trainfree.method:
        edit = trainfree_method(str(cfg.trainfree.method)).label
        raise BadValue(f"{path} is a derived run ({edit}, made from {cfg.trainfree.source}): its edit runs as hooks "
                       f"on the forward pass, which model.safetensors cannot carry, so the exported model would not "
                       f"compute it; export the trained checkpoint, ckpt={cfg.trainfree.source}")
    if cfg.imported:
        raise BadValue(f"{path} is the import of the pretrained model {cfg.imported}, not a variant vitsinks trained: "
                       f"use that model from its own library")
    model, cfg = backbone_from_state(state, path)
    progress = state.get("progress") or {}
    run = RunDir.of_checkpoint(path) if in_run(path) and RunDir.of_checkpoint(path).is_run() else None
    step, epoch = progress.get("step"), progress.get("epoch")
    return Source(path, model.float().eval(), cfg, None if step is None else int(step),
                  None if epoch is None else int(epoch), run, files.sha256(path))
