"""What some tests need from the machine (an optional library, a SLURM cluster, a data set, a browser): without it
they skip, with the reason, except under CI (CI=true), which provides it and where a skip would hide a broken set-up."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest


def _missing(skip: str, fail: str) -> NoReturn:
    """Skip with `skip`, or under CI (CI=true) fail with `fail`."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(fail)
    pytest.skip(skip)


def require(module: str) -> ModuleType:
    """`module` imported; missing: a skip, or under CI=true a failure (CI installs the extras)."""
    if os.environ.get("CI", "").lower() == "true":
        try:
            return importlib.import_module(module)
        except ImportError as e:
            pytest.fail(f"{module} is missing ({e}); CI installs the extras: pip install -e '.[dev,hf,clip,mmseg]'",
                        pytrace=False)
    return pytest.importorskip(module)


def require_slurm() -> None:
    """Skip without a responding SLURM, except under CI (CI=true), where a skip would hide a broken cluster."""
    ok = shutil.which("sbatch") is not None and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0
    if not ok:
        reason = "no responding SLURM (start one: bash slurm/local-cluster.sh start)"
        _missing(reason, f"{reason}; CI must run the SLURM tests")


def require_fashion_mnist() -> None:
    """Skip without the Debian package dataset-fashion-mnist, except under CI (CI=true), which installs it."""
    from vitsinks.data import FASHION_MNIST_ROOT

    if not Path(FASHION_MNIST_ROOT).is_dir():
        reason = "Debian package dataset-fashion-mnist absent (apt-get install dataset-fashion-mnist)"
        _missing(reason, f"{reason}; CI must run the Fashion-MNIST tests")


def require_chromium() -> str:
    """The browser, or a skip; under CI (CI=true) a missing browser fails."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        _missing("chromium not installed (apt-get install chromium)",
                 "chromium is missing: CI must install it (apt-get install chromium)")
    return browser
