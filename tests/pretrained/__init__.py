"""Tests of vitsinks.pretrained. The optional libraries (the `hf` and `clip` extras) skip their tests when missing,
except under CI (CI=true), which installs them: there a missing one fails (`require`)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str) -> ModuleType:
    """`module` imported; missing: a skip, or under CI=true a failure (CI installs the extras)."""
    if os.environ.get("CI", "").lower() == "true":
        try:
            return importlib.import_module(module)
        except ImportError as e:
            pytest.fail(f"{module} is missing ({e}); CI installs the extras: pip install -e '.[dev,hf,clip]'",
                        pytrace=False)
    return pytest.importorskip(module)
