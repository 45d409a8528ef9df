"""Weights on disk: the one checkpoint reader, the finiteness check, and the backbone of any state dict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vitsinks.utils.errors import BadValue, NonFinite


def non_finite(tensors: dict[str, Any]) -> list[str]:
    """Names of the floating-point tensors of a state dict that hold NaN or inf."""
    return [k for k, v in tensors.items() if torch.is_tensor(v) and v.is_floating_point() and
            not bool(torch.isfinite(v).all())]


def check_finite(tensors: dict[str, Any], what: str) -> None:
    """`NonFinite` naming `what` and the first bad tensors when any weight is NaN or inf."""
    bad = non_finite(tensors)
    if bad:
        raise NonFinite(f"{what} holds non-finite weights (NaN or inf) in {len(bad)} tensors, e.g. "
                        f"{', '.join(bad[:3])}: the run diverged; lower train.lr and train from an earlier "
                        f"checkpoint")


def load(path: Path) -> dict[str, Any]:
    """Load a checkpoint on the CPU; an unreadable file is a `BadValue` naming it (truncated, or not one)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the same thing to the user
        if _is_torch_archive(path):
            raise BadValue(f"cannot read checkpoint {path} ({type(err).__name__}): it is truncated or corrupt; "
                           f"resume from another checkpoint of the run (checkpoints/step_*.pt) or delete it to "
                           f"start over") from err
        raise BadValue(f"{path} is not a PyTorch checkpoint ({type(err).__name__}): pass a file written by "
                       f"vitsinks (runs/<name>/checkpoints/*.pt)") from err


def _is_torch_archive(path: Path) -> bool:
    """Whether a file starts like `torch.save`'s zip archive (a truncated one still does)."""
    with Path(path).open("rb") as f:
        return f.read(4) == b"PK\x03\x04"


def backbone_state(obj: dict[str, Any]) -> dict[str, Any]:
    """The backbone's tensors of a model state dict: `backbone.*` keys without the prefix (the LeJEPA and supervised
    wrappers), or the dict itself when it has none."""
    if any(k.startswith("backbone.") for k in obj):
        return {k.removeprefix("backbone."): v for k, v in obj.items() if k.startswith("backbone.")}
    return obj


def state_dict_from_file(path: Path) -> dict[str, torch.Tensor]:
    """A backbone state dict from a plain state-dict file, a {'state_dict'|'model': ...} wrapper, or a vitsinks
    training checkpoint (whose model holds `backbone.*`, `projector.*`, `probe.*`)."""
    obj = load(path)
    for key in ("model", "state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise BadValue(f"{path} holds a {type(obj).__name__}, not a state dict: pass a state-dict file or checkpoint")
    return backbone_state(obj)
