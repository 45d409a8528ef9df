"""The one way vitsinks reads a `torch.save` file: `torch.load(weights_only=True)`, so that no file it reads can
run code it carries. A file that names Python objects beyond tensors, plain data and `argparse.Namespace` (as timm
allows) is refused with an `UnsafeFile` naming them and, for data types, the one-off conversion of a trusted file
(`python -m vitsinks.convert`).
"""

from __future__ import annotations

import argparse
import pickle
import pickletools
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from vitsinks.utils.errors import BadFile

ALLOWED = [argparse.Namespace]  # beyond torch's own weights-only set; timm allows the same
# What checkpoints of earlier vitsinks versions name beyond the allowed set: numpy's random state (its arrays)
EARLIER_VITSINKS = re.compile(r"^numpy(\._core|\.core)?\.(multiarray\._reconstruct|ndarray|dtype|dtypes\.\w+)$")
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
# The data types `vitsinks.convert` turns into plain data: the only objects a file may name and still be offered the
# conversion; anything else (a function such as os.system, a script's own class) is refused outright.
CONVERTIBLE = re.compile(r"^(numpy(\._core|\.core)?\.(multiarray\.(_reconstruct|scalar)|ndarray|dtype|dtypes\.\w+)|"
                         r"omegaconf\.(dictconfig\.DictConfig|listconfig\.ListConfig|nodes\.\w+|base\.\w+)|"
                         r"collections\.(OrderedDict|defaultdict|deque|Counter)|argparse\.Namespace|"
                         r"pathlib\.(Pure)?(Posix|Windows)?Path|fractions\.Fraction|decimal\.Decimal|"
                         r"builtins\.(set|frozenset|complex|bytearray|slice)|torch\.storage\._load_from_bytes|"
                         r"torch\._utils\._rebuild_\w+|typing\.Any)$")


def convertible(names: list[str]) -> bool:
    """Whether every object a file names is a data type `vitsinks.convert` turns into plain data (`CONVERTIBLE`)."""
    return all(CONVERTIBLE.match(n) for n in names)


class UnsafeFile(BadFile):
    """A file names Python objects beyond tensors and plain data: reading it could run code, so it is not read."""


def unsafe_globals(path: Path, err: BaseException | None = None) -> list[str]:
    """The Python objects a `torch.save` file names beyond what weights-only loading allows, read without running
    anything (torch's own scan of a zip archive; for the legacy format, the one named in `err`)."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception:  # noqa: BLE001 - not a zip archive (legacy format, bare pickle): its opcodes name them
        names = list(dict.fromkeys(_GLOBAL.findall(str(err or "")) + pickle_globals(path)))
    allowed = {f"{c.__module__}.{c.__qualname__}" for c in ALLOWED} | set(_torch_allowed())
    return [n for n in names if n not in allowed]


def _torch_allowed() -> list[str]:
    """What torch's weights-only unpickler reads by itself (a private list: none when it moves)."""
    from torch import _weights_only_unpickler as unpickler

    return list(getattr(unpickler, "_get_allowed_globals", dict)())


def pickle_globals(path: Path, pickles: int = 5) -> list[str]:
    """The `module.name`s the first `pickles` pickles of a file import, read off their opcodes (`pickletools`: no
    object is built, nothing runs); a legacy torch file is a few pickles followed by raw tensor bytes."""
    found: list[str] = []
    with Path(path).open("rb") as f:
        for _ in range(pickles):
            strings: list[str] = []
            try:
                for op, arg, _pos in pickletools.genops(f):
                    if op.name == "GLOBAL":
                        found.append(str(arg).replace(" ", "."))
                    elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                        found.append(f"{strings[-2]}.{strings[-1]}")
                    elif isinstance(arg, str):
                        strings.append(arg)
            except Exception:  # noqa: BLE001 - past the pickles (tensor bytes) or a damaged file: what was read
                break
    return list(dict.fromkeys(found))


def refusal(path: Path, names: list[str]) -> UnsafeFile:
    """The one-line `UnsafeFile` for a file that names `names`."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    convert = f"python -m vitsinks.convert file={path} trust=true"  # the one-off conversion of a trusted file
    if all(EARLIER_VITSINKS.match(n) for n in names):
        return UnsafeFile(f"{path} was written by an earlier vitsinks (its random state holds numpy arrays: {shown}), "
                          f"which only an unsafe load could read: if you trust the file, convert it once with "
                          f"`{convert}`")
    if not convertible(names):
        odd = [n for n in names if not CONVERTIBLE.match(n)]
        return UnsafeFile(f"{path} names {', '.join(odd[:3])}, which is no data type: unpickling it could run code "
                          f"(a function, or a script's own class), so nothing was loaded or run and it cannot be "
                          f"converted; do not use this file, or re-save its tensors with the code that wrote it "
                          f"(torch.save(model.state_dict(), ...))")
    return UnsafeFile(f"{path} holds Python objects beyond tensors and plain data ({shown}); loading it could run "
                      f"code it carries, so nothing was loaded or run: use weights from a source you trust, or, if "
                      f"you trust this file, convert it once with `{convert}`")


def torch_load(path: Path | str, mmap: bool = False) -> Any:
    """What a `torch.save` file holds, on the CPU, read weights-only (`mmap`: tensors mapped, not read). A file
    naming other Python objects is an `UnsafeFile`; any other failure is raised as torch raised it."""
    path = Path(path)
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals([*ALLOWED]):
            warnings.simplefilter("ignore")  # torch warns about pickle protocols of foreign files
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:  # a weights-only refusal, or no pickle at all
        if names := unsafe_globals(path, err):
            raise refusal(path, names) from None
        raise
