"""The one layer between vitsinks and the disk. Writes are atomic (a reader sees the old file or the new one); a
write the file system refuses (permission, read-only, full disk or quota) is a `DiskFault` naming the path, the
cause and the fix. Reads of the files vitsinks writes turn a torn or foreign file into a `BadFile` naming the file,
what is wrong and the command that writes it again.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

from vitsinks.utils.errors import BadFile, BadValue, UserError
from vitsinks.utils.safeload import UnsafeFile, torch_load

TMP_SUFFIX = ".tmp"

# errno -> (the cause in words, the fix) of the write faults a user can do something about
FAULTS: dict[int, tuple[str, str]] = {
    errno.EACCES: ("permission denied", "make it writable, or set runs_dir= to a folder you can write"),
    errno.EPERM: ("operation not permitted", "make it writable, or set runs_dir= to a folder you can write"),
    errno.EROFS: ("read-only file system", "set runs_dir= to a folder on a writable file system"),
    errno.ENOSPC: ("no space left on the device", "free space there, or set runs_dir= to a disk with room"),
    errno.EDQUOT: ("disk quota exceeded", "free space in your quota, or set runs_dir= elsewhere"),
}


class DiskFault(UserError, OSError):
    """The file system refused a write (`FAULTS`): not bad input, but the user's to fix; nothing was overwritten."""

    def __init__(self, message: str, err: int) -> None:
        super().__init__(message)
        self.errno = err


def fault(err: OSError, path: Path | str | None = None, doing: str = "write") -> DiskFault | None:
    """The `DiskFault` of an `OSError` raised while `doing` something to `path` (default: the error's file name), or
    None when it is no such fault. `doing="access"`: not known to be a write, so a refused permission is named
    without the advice for the runs folder."""
    if isinstance(err, DiskFault):
        return err
    if err.errno not in FAULTS:
        return None
    cause, fix = FAULTS[err.errno]
    where = path or err.filename  # the file meant, not its temp file
    if doing != "write" and err.errno in (errno.EACCES, errno.EPERM):
        return DiskFault(f"cannot access {where}: {cause}: check its permissions (vitsinks reads its inputs and "
                         f"writes under runs_dir=)", err.errno)
    return DiskFault(f"cannot write {where}: {cause}: {fix}; nothing earlier was overwritten", err.errno)


@contextmanager
def faults_named(path: Path | str) -> Iterator[None]:
    """Turn the write faults (`FAULTS`) raised inside the block into a `DiskFault` naming `path`."""
    try:
        yield
    except OSError as err:
        named = fault(err, path)
        if named is None or named is err:
            raise
        raise named from err


LOCK_TRIES = 6  # over 0.25 s
NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK)  # flock's errors where locks are not offered


class FileLock:
    """An exclusive `flock` on `path`, taken without waiting: a second holder is a `BadValue` naming the holder (the
    file records pid and host) and `fix`. Released by `release`, a `with` block's end, or the process's end."""

    def __init__(self, path: Path | str, what: str, fix: str) -> None:
        self.path, self.what, self.fix = Path(path), what, fix
        self._f: IO | None = None

    def _open(self) -> IO:
        with faults_named(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return self.path.open("a+")

    def acquire(self) -> FileLock:
        if self._f is not None:
            return self
        f = self._open()
        try:
            for attempt in range(LOCK_TRIES):  # a reader's probe (`launch status`) holds it for microseconds
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if attempt == LOCK_TRIES - 1:
                        raise
                    time.sleep(0.05)
                    continue
                if _same_file(f, self.path):
                    break
                f.close()  # its holder removed the file meanwhile (`RunDir.locked`): lock the one there now
                f = self._open()
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise BadValue(f"{self.what} is being written by {holder}: {self.fix}") from None
        except OSError as err:
            f.close()
            if err.errno not in NO_FLOCK:
                raise
            raise BadValue(f"the file system of {self.path.parent} does not support file locks (flock: "
                           f"{err.strerror}; Lustre mounted without -o flock?): mount it with flock, or set "
                           f"runs_dir=... on a local or NFS file system") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}")
        f.flush()
        self._f = f
        return self

    def release(self) -> None:
        if self._f is not None:
            fcntl.flock(self._f, fcntl.LOCK_UN)
            self._f.close()
            self._f = None

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(f: IO, path: Path) -> bool:
    """Whether the open file `f` is still the file at `path` (not one unlinked since it was opened)."""
    try:
        return os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


class _Recording:
    """A binary file that remembers the `OSError` its writes raised (`torch.save` reports it as a RuntimeError)."""

    def __init__(self, f: IO) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = err
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


@contextmanager
def atomic_open(path: Path, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """A temp file beside `path` (`mode` "w" or "wb"), renamed onto `path` when the block succeeds, else removed."""
    path = Path(path)
    with faults_named(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    recording = None
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            recording = _Recording(f) if "b" in mode else None
            yield cast(IO, recording) if recording else f  # _Recording stands in for the file it wraps
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        cause = recording.error if recording is not None and recording.error is not None else err
        if isinstance(cause, OSError) and (named := fault(cause, path)) is not None:
            raise named from err
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


def _torn(path: Path, what: str, detail: str, rerun: str) -> BadFile:
    again = " to write it again" if rerun.startswith(("rerun", "relaunch")) else ""
    return BadFile(f"{path} is torn or is not {what} ({detail}): {rerun}{again}")


def read_json(path: Path | str, rerun: str, what: str = "the JSON vitsinks writes") -> Any:
    """The JSON object in `path`; a torn or foreign file is a `BadFile` whose fix is `rerun` (e.g. "rerun ...")."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except UnicodeDecodeError as err:
        raise _torn(path, what, "not text", rerun) from err
    except ValueError as err:
        raise _torn(path, what, f"invalid JSON: {' '.join(str(err).split())}", rerun) from err
    if not isinstance(obj, dict):
        raise _torn(path, what, f"a JSON {type(obj).__name__}, not an object", rerun)
    return obj


def read_jsonl(path: Path | str, rerun: str) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a torn last line is dropped, any other bad line is a `BadFile`."""
    path = Path(path)
    lines = [ln for ln in path.read_bytes().decode("utf-8", "replace").splitlines() if ln.strip()]
    out = []
    for i, ln in enumerate(lines):
        try:
            rec = json.loads(ln)
        except ValueError as err:
            if i == len(lines) - 1:
                break  # the append a kill cut short
            raise _torn(path, "JSON lines", f"line {i + 1}: {' '.join(str(err).split())}", rerun) from err
        if not isinstance(rec, dict):
            raise _torn(path, "JSON lines", f"line {i + 1} is not an object", rerun)
        out.append(rec)
    return out


def read_npz(path: Path | str, rerun: str) -> dict[str, np.ndarray]:
    """Every array of a `.npz` file, read now; a torn or foreign file is a `BadFile`."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise _torn(path, "the arrays vitsinks writes (.npz)", " ".join(str(err).split()) or type(err).__name__,
                    rerun) from err


def read_torch(path: Path | str, rerun: str) -> Any:
    """What `torch_save` wrote to `path` (on the CPU), read weights-only; a torn or foreign file is a `BadFile`."""
    path = Path(path)
    try:
        return torch_load(path)
    except (FileNotFoundError, UnsafeFile):  # an UnsafeFile is a BadFile already
        raise
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the same to the user
        raise _torn(path, "a file vitsinks saved with torch", " ".join(str(err).split())[:200] or type(err).__name__,
                    rerun) from err


def read_csv(path: Path | str, rerun: str, needs: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """The rows of a CSV file; one without the `needs` columns, or with a short row, is a `BadFile`."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = reader.fieldnames or []  # a table of no rows still has its header
    except (UnicodeDecodeError, csv.Error) as err:
        raise _torn(path, "a CSV table", " ".join(str(err).split()), rerun) from err
    if missing := [c for c in needs if c not in header]:
        raise _torn(path, "the table vitsinks writes", f"no column {', '.join(missing)}", rerun)
    if any(None in r.values() for r in rows):
        raise _torn(path, "a whole CSV table", "a row is cut short", rerun)
    return rows


def remove(path: Path) -> None:
    """Delete a file, or a folder with everything in it (a link as a file)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


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
        remove(p)
    return found
