"""The repository's scripts outside the package (eval/**/*.py), loaded from their files as modules."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: str, name: str) -> ModuleType:
    """The script at `path` (relative to the repository) run as a fresh module called `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
