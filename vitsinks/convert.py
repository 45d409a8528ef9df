"""Convert a trusted checkpoint or weights file once so that it loads safely (weights-only).

    python -m vitsinks.convert file=runs/<name>/checkpoints/last.pt trust=true
    python -m vitsinks.convert file=downloaded.pth trust=true out=converted.pt

vitsinks reads every `torch.save` file weights-only (docs/commands.md#convert). This command reads a refused file the
unsafe way, which runs any code it carries (use it only on a file whose origin you trust; one that names a function or
a script's own class is refused anyway), and writes the same content as plain data, read back and compared; without
`out=` in place, the original kept as `<file>.unsafe`.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from vitsinks.configs.cli import parse_args, run_command
from vitsinks.train.checkpoint import numpy_state
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue, ConfigError, InputNotFound
from vitsinks.utils.safeload import UnsafeFile, convertible, torch_load, unsafe_globals

USAGE = "python -m vitsinks.convert file=<checkpoint or weights file> trust=true [out=<file>]"
KEPT = ".unsafe"  # the suffix of the original, kept beside a file converted in place


@dataclass
class ConvertArgs:
    file: str | None = None  # the file to convert (a torch.save file vitsinks refused to read)
    trust: bool = False  # true: you trust the file's origin (converting runs any code it carries)
    out: str | None = None  # default: the file itself, its original kept as <file>.unsafe


def plain(obj: Any, where: str = "") -> Any:
    """`obj` as tensors, plain containers, numbers and strings (what weights-only loading reads); a `BadValue`
    naming the entry for an object with no plain form."""
    if torch.is_tensor(obj) or obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":  # objects, strings, dates: no tensor holds them
            raise BadValue(f"the entry {where or '(the whole file)'} is a numpy array of {obj.dtype}, which has no "
                           f"tensor form: nothing was written; extract the tensors you need by hand")
        return torch.from_numpy(obj.astype(np.int64) if obj.dtype == np.uint32 else obj.copy())
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, (Fraction, Decimal)):
        return float(obj)
    if isinstance(obj, (set, frozenset)):
        obj = sorted(obj, key=repr)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (DictConfig, ListConfig)):
        return OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, argparse.Namespace):
        obj = vars(obj)
    if isinstance(obj, tuple) and len(obj) == 5 and obj[0] == "MT19937" and isinstance(obj[1], np.ndarray):
        return numpy_state(obj)  # numpy's random state, as vitsinks writes it today
    if isinstance(obj, dict):  # an OrderedDict stays one (state dicts); any other mapping becomes a dict
        kind = OrderedDict if isinstance(obj, OrderedDict) else dict
        return kind((k, plain(v, f"{where}.{k}" if where else str(k))) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):  # a named tuple becomes a plain one
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    raise BadValue(f"the entry {where or '(the whole file)'} is a {type(obj).__module__}.{type(obj).__qualname__}, "
                   f"which has no plain form: nothing was written; extract the tensors you need by hand")


def same(a: Any, b: Any) -> bool:
    """Whether two plain objects hold equal content (tensors bit for bit)."""
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b) or (a != a and b != b)  # NaN equals NaN here


def convert(src: Path, out: Path | None) -> Path:
    """Write `src`'s content as plain data to `out` (None: in place, the original kept) and return where; the unsafe
    load this needs runs any code `src` carries."""
    try:
        torch_load(src)
        raise BadValue(f"{src} already loads safely (weights-only): nothing to convert")
    except UnsafeFile:
        if not convertible(unsafe_globals(src)):
            raise  # it names a function or a class: no trust makes unpickling it a conversion
    except BadValue:
        raise
    except Exception as err:  # noqa: BLE001 - truncated, not a torch file: say so rather than unpickle it
        raise BadValue(f"{src} is not a readable torch.save file ({type(err).__name__}): nothing to convert") from err
    # The one deliberate unsafe load of the package: the user said trust=true for this file.
    try:
        loaded = torch.load(src, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - a module or class it names is not importable here, a torn file
        raise BadValue(f"{src} does not load even the unsafe way ({type(err).__name__}: "
                       f"{' '.join(str(err).split())[:200]}): nothing was written") from err
    content = plain(loaded)
    dst = out or src
    if out is None:
        kept = src.with_name(src.name + KEPT)
        if kept.exists():
            raise BadValue(f"{kept} exists (an earlier conversion's original?): move it away, or pass out=<file>")
        try:
            os.link(src, kept)  # the original stays, under its new name
        except OSError:  # no hard links on this file system
            shutil.copy2(src, kept)
    files.torch_save(content, dst)
    if not same(content, torch_load(dst)):
        raise BadValue(f"{dst} does not read back as written: the disk may be failing; the original is {src}")
    return dst


def convert_command(argv: Sequence[str]) -> int:
    args = parse_args(argv, ConvertArgs, USAGE)
    if not args.file:
        raise ConfigError(f"no file given; usage: {USAGE}")
    src = Path(args.file).expanduser()
    if not src.is_file():
        raise InputNotFound(f"{src} not found: pass the file a vitsinks command refused (file=...)")
    if not args.trust:
        raise ConfigError(f"converting {src} reads it the unsafe way, which runs any code it carries: add trust=true "
                          f"only if you trust where the file came from")
    out = Path(args.out).expanduser() if args.out else None
    if out is not None and out.exists():
        raise BadValue(f"{out} exists: pass a new file name (out=...), nothing was overwritten")
    dst = convert(src, out)
    kept = f"; the original is {src}{KEPT}" if out is None else ""
    print(f"converted: {dst} now loads weights-only{kept}")
    return 0


main = run_command(convert_command)

if __name__ == "__main__":
    main()
