"""Atomic file writes: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import torch

TMP_SUFFIX = ".tmp"


@contextmanager
def atomic_open(path: Path, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temp file beside `path` (`.<name>.<random>.tmp`); on success fsync it and rename it onto `path`,
    on failure remove it. `mode` is "w" (text) or "wb"."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically."""
    with atomic_open(path) as f:
        f.write(text)


def write_json(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    write_text(path, json.dumps(obj, indent=1))


def torch_save(obj: Any, path: Path) -> None:
    """`torch.save` to `path` atomically."""
    with atomic_open(path, "wb") as f:
        torch.save(obj, f)


def stamp(path: str | Path) -> str:
    """A file's version as a cache key part, `size:mtime_ns`: a rewritten file (or one copied over it) is new."""
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


def sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    """The SHA-256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def remove_leftovers(folder: Path) -> list[Path]:
    """Delete the temp files of writes that were killed (`.<name>.<random>.tmp`) in `folder`; return them."""
    found = sorted(Path(folder).glob(f".*{TMP_SUFFIX}")) if Path(folder).is_dir() else []
    for p in found:
        p.unlink(missing_ok=True)
    return found
