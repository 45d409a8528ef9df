"""Atomic checkpoints holding the whole training state, and the check that a checkpoint fits the run."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

ARCH_KEYS = ("size", "img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias",
             "layerscale_init", "gate", "registers", "attn", "mlp", "proj_bias", "patch_embed", "pos_embed",
             "global_pathway")
# fields added after checkpoints were first written: a checkpoint without them had these values
ARCH_DEFAULTS = {"mlp": True, "proj_bias": True, "patch_embed": "learned", "pos_embed": "learn",
                 "global_pathway": {"enabled": False, "state_dim": 64, "gate": "learned", "layerscale_init": None}}


class CheckpointMismatch(ValueError):
    """A checkpoint was written by a run of another variant or architecture."""


def atomic_save(obj: Any, path: Path) -> None:
    """Write `obj` to a temp file beside `path`, fsync, then rename: `path` is either the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rng_state() -> dict[str, Any]:
    """Every global RNG: python, numpy, torch CPU and CUDA."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load(path: Path) -> dict[str, Any]:
    """Load a checkpoint on the CPU; an unreadable file is a clear error naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the same thing to the user
        raise ValueError(f"cannot read checkpoint {path} ({err}); it may be truncated: delete it to start over") \
            from err


def describe(model_cfg: dict[str, Any]) -> str:
    from vitsinks.models import variant_name

    pathway = bool((model_cfg.get("global_pathway") or {}).get("enabled"))
    return (f"{variant_name(model_cfg['gate'], model_cfg['registers'], model_cfg['attn'], pathway)} "
            f"{model_cfg['size']} (dim {model_cfg.get('embed_dim') or 'default'}, "
            f"depth {model_cfg.get('depth') or 'default'})")


def _arch(model_cfg: dict[str, Any]) -> dict[str, Any]:
    """Architecture fields with defaults filled in; a switched-off pathway's settings do not matter."""
    out = {**ARCH_DEFAULTS, **model_cfg}
    if not (out["global_pathway"] or {}).get("enabled"):
        out["global_pathway"] = {"enabled": False}
    return out


def check_compatible(ckpt_model: dict[str, Any], run_model: dict[str, Any], path: Path) -> None:
    """Raise `CheckpointMismatch` naming both architectures when they differ in any architecture field."""
    ckpt_model, run_model = _arch(ckpt_model), _arch(run_model)
    diff = [k for k in ARCH_KEYS if ckpt_model.get(k) != run_model.get(k)]
    if diff:
        fields = ", ".join(f"{k}: {ckpt_model.get(k)!r} vs {run_model.get(k)!r}" for k in diff)
        raise CheckpointMismatch(
            f"{path} holds a {describe(ckpt_model)} model but this run is {describe(run_model)} ({fields}). "
            f"Nothing was overwritten: pick another run name (name=...) or runs_dir, or relaunch with the "
            f"checkpoint's settings."
        )
