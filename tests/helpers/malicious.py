"""Files whose unpickling would run code: planted wherever vitsinks reads a `torch.save` file."""

from __future__ import annotations

import os
import pickle
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch


class _RunsCommand:
    """Unpickled, it runs `touch <marker>` (through `os.system`, as a hostile file would)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch '{self.marker}'",)


def plant(path: Path, marker: Path, fmt: str = "zip") -> Path:
    """Write to `path` a file that creates `marker` when unpickled, in one of the three forms a `.pt` file takes:
    torch's zip archive (`zip`), its legacy format (`legacy`), or a bare pickle (`pickle`). The payload sits beside
    real tensors, where a checkpoint's config or a state dict's entry would be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = {"model": {"w": torch.zeros(2)}, "config": _RunsCommand(marker), "progress": {"step": 3}}
    if fmt == "pickle":
        path.write_bytes(pickle.dumps(obj))
    else:
        torch.save(obj, path, _use_new_zipfile_serialization=fmt == "zip")
    return path


def plant_numpy(path: Path) -> Path:
    """A checkpoint as earlier vitsinks versions wrote them: numpy's random state as numpy's own tuple."""
    torch.save({"model": {"w": torch.zeros(2)}, "rng": {"numpy": np.random.get_state()}}, path)
    return path


def plant_object(path: Path) -> Path:
    """Weights carrying a harmless Python object that weights-only loading does not read (a `Fraction`)."""
    torch.save({"w": torch.zeros(2), "lr": Fraction(1, 3)}, path)
    return path
