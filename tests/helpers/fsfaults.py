"""File systems that refuse writes, for the tests of the fault layer: a small tmpfs that fills up and a read-only
bind mount. Both need root (mount); elsewhere the tests skip with the reason, except in CI (`CI` set), which runs as
root and must never skip them."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        why = f"cannot mount ({done.stderr.strip() or 'mount failed'}): the fault tests need root"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextmanager
def small_fs(path: Path, size_kb: int = 4096) -> Iterator[Path]:
    """`path` as an empty tmpfs of `size_kb` KiB (a disk that fills up)."""
    path.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path))
    try:
        yield path
    finally:
        _umount(path)


@contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """`path` (a folder) read-only while the block runs: a read-only bind mount over itself."""
    path.mkdir(parents=True, exist_ok=True)
    _mount("--bind", "-o", "ro", str(path), str(path))
    try:
        yield path
    finally:
        _umount(path)


def fill(folder: Path, leave_kb: int = 16) -> Path:
    """Fill the file system of `folder` up to `leave_kb` KiB free with one file; return it."""
    filler = folder / "filler.bin"
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize - leave_kb * 1024
    with filler.open("wb") as f:
        f.write(b"\0" * max(free, 0))
    return filler
