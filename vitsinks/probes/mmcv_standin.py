"""A stand-in for mmcv's compiled ops, so that mmsegmentation imports and runs on mmcv-lite (`vitsinks[mmseg]`).

mmseg imports `mmcv.ops`, whose loader asks for the compiled module `mmcv._ext`; mmcv-lite has none, and full mmcv
does not build against torch >= 2.10. `install()` puts a module in its place, only when the real one cannot be
imported (a user with full mmcv keeps it). Every function it hands out raises `MissingCompiledOp`, one line naming
the op and what to install; the heads of the shipped configs (linear, multi-layer linear, UperNet) use none.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

from vitsinks.utils.errors import UserError

NAME = "mmcv._ext"


class MissingCompiledOp(UserError, RuntimeError):
    """A model called one of mmcv's compiled ops, which this install does not have."""


class _CompiledOps(types.ModuleType):
    """`mmcv._ext` without its ops: any attribute is a function that raises `MissingCompiledOp`."""

    def __getattr__(self, op: str) -> Callable[..., Any]:
        if op.startswith("__"):
            raise AttributeError(op)

        def missing(*args: Any, **kwargs: Any) -> Any:
            raise MissingCompiledOp(
                f"mmcv compiled op {op} is not available: mmcv-lite has no compiled ops; use a model that needs none "
                f"(the shipped linear, linear_multilayer and upernet configs), or install full mmcv built for this "
                f"torch (pip install mmcv==2.1.0, compiled from source)")

        missing.__name__ = op
        return missing


def install() -> bool:
    """Put the stand-in in place of `mmcv._ext` where mmcv is installed without it (mmcv-lite); True when the
    stand-in is in place."""
    if NAME in sys.modules:
        return isinstance(sys.modules[NAME], _CompiledOps)
    if importlib.util.find_spec("mmcv") is None:
        return False  # no mmcv at all: nothing to stand in for
    try:
        importlib.import_module(NAME)
        return False
    except ImportError:
        pass
    stand_in = _CompiledOps(NAME, "mmcv's compiled ops, not installed (vitsinks.probes.mmcv_standin)")
    stand_in.__spec__ = importlib.machinery.ModuleSpec(NAME, None)  # no loader: mmengine sees no full mmcv
    sys.modules[NAME] = stand_in
    return True
