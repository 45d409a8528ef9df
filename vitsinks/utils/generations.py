"""Generations: what vitsinks writes as one into a folder of its own (a diagnosis, an interventions report, a
leaderboard), replaced as one, and nothing else of the folder ever removed.

A generation is written into a staging folder (`.gen-<random>.tmp`) and moved in when complete. The folder's record,
`.vitsinks.json`, names its kind and every file it wrote (while the files move: both generations'); the next one
removes exactly the recorded files it does not write again, so the user's files stay. A generation goes into an
empty or new folder or over one of its kind (an earlier version's folder: by `Kind.marks` and `Kind.legacy`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vitsinks.utils import files
from vitsinks.utils.errors import BadValue

RECORD = ".vitsinks.json"  # in a generation's folder: its kind and the files it wrote
STAGE = ".gen-"  # the prefix of a staging folder (`.gen-<random>.tmp`), removed by the next generation if killed


@dataclass(frozen=True)
class Kind:
    """What vitsinks writes as one generation into a folder: `name` (in messages), `marks` (names that tell a folder
    of an earlier version without a record), `legacy` (the names those versions wrote there), `keep` (vitsinks's
    other entries there: never removed, never the user's) and `last` (the file that marks a generation done: moved in
    last, its old copy removed first)."""

    name: str
    marks: tuple[str, ...]
    legacy: tuple[str, ...]
    keep: tuple[str, ...] = ()
    last: str = ""


def _files_under(root: Path, rel: str = "") -> set[str]:
    """Every file (a link as a file) at or under `root / rel`, as paths relative to `root` (posix)."""
    path = root / rel if rel else root
    if not path.is_dir() or path.is_symlink():
        return {rel} if rel and (path.exists() or path.is_symlink()) else set()
    return {f for child in path.iterdir() for f in _files_under(root, f"{rel}/{child.name}".lstrip("/"))}


def _inside(rel: str) -> bool:
    """Whether a recorded path stays inside its folder (relative, without `..`): an edited record could name any."""
    parts = PurePosixPath(rel).parts
    return bool(parts) and not PurePosixPath(rel).is_absolute() and ".." not in parts and "\\" not in rel


def _vitsinks_own(name: str, kind: Kind) -> bool:
    """Whether an unrecorded top-level entry is vitsinks's: the record, a kept entry, a staging folder or temp file."""
    return name == RECORD or name in kind.keep or (name.startswith(".") and name.endswith(files.TMP_SUFFIX))


def written(folder: Path | str, kind: Kind) -> set[str] | None:
    """The files of the generation of `kind` in `folder` (relative to it): its record's, or in an earlier version's
    folder the files under `kind.legacy`; None when it holds none. A record of another kind is a `BadValue`."""
    folder = Path(folder)
    record = folder / RECORD
    if record.is_file():
        fix = f"give an empty or new folder (or delete {record} if {folder} holds nothing of vitsinks's)"
        got = files.read_json(record, fix, "the record vitsinks keeps of its files")
        if got.get("kind") != kind.name or not isinstance(got.get("files"), list):
            raise BadValue(f"{folder} holds vitsinks's {got.get('kind') or 'files of another kind'}, not its "
                           f"{kind.name}: give an empty or new folder for the {kind.name}")
        names = {str(f) for f in got["files"]}
        if outside := sorted(n for n in names if not _inside(n)):
            raise BadValue(f"{record} names files outside {folder} ({', '.join(outside[:3])}): it is not a record "
                           f"vitsinks wrote; nothing was removed: {fix}")
        return names
    if any((folder / m).exists() for m in kind.marks) or any(folder.glob(f"{STAGE}*{files.TMP_SUFFIX}")):
        return {f for name in kind.legacy for f in _files_under(folder, name)}
    return None


def claim(folder: Path | str, kind: Kind) -> set[str]:
    """The files of the earlier generation of `kind` in `folder` (`written`); a non-empty folder without one is a
    `BadValue`. Looks only."""
    folder = Path(folder)
    if (old := written(folder, kind)) is not None:
        return old
    theirs = sorted(p.name for p in folder.iterdir() if not _vitsinks_own(p.name, kind)) if folder.is_dir() else []
    if theirs:
        shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
        raise BadValue(f"{folder} holds files vitsinks did not write ({shown}): give an empty or new folder for the "
                       f"{kind.name} (vitsinks replaces only files it wrote, and cannot tell them from yours there)")
    return set()


def _record(folder: Path, kind: Kind, names: set[str]) -> None:
    files.write_json(folder / RECORD, {"kind": kind.name, "files": sorted(names)})


def _remove_files(folder: Path, names: set[str]) -> None:
    """Remove `names` (files relative to `folder`) and then each of their folders left empty, up to `folder`."""
    for rel in sorted(names):
        path = folder / rel
        if path.is_file() or path.is_symlink():
            path.unlink()
        parent = path.parent
        while parent != folder and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent


@contextmanager
def generation(folder: Path | str, kind: Kind) -> Iterator[Path]:
    """A new generation of `kind` in `folder`: the block writes its files into the staging folder it is given; when
    it returns they replace their namesakes and the earlier generation's other files are removed. A folder `claim`
    refuses, or a new file whose namesake is the user's, is refused before any file moves; an interrupted block
    leaves the earlier generation whole."""
    folder = Path(folder)
    with files.faults_named(folder):
        folder.mkdir(parents=True, exist_ok=True)
        old = claim(folder, kind)
        for stale in folder.glob(f"{STAGE}*{files.TMP_SUFFIX}"):  # a killed generation's staging folder
            files.remove(stale)
        stage = Path(tempfile.mkdtemp(prefix=STAGE, suffix=files.TMP_SUFFIX, dir=folder))
    try:
        yield stage
        new = _files_under(stage)
        if theirs := sorted(r for r in new - old if (folder / r).exists() or (folder / r).is_symlink()):
            raise BadValue(f"{folder / theirs[0]} was not written by vitsinks: move it, or give an empty or new folder "
                           f"for the {kind.name}")
        last = [kind.last] if kind.last in new else []
        with files.faults_named(folder):
            _record(folder, kind, old | new)  # a kill from here on leaves a record of every file in place
            if last:
                (folder / kind.last).unlink(missing_ok=True)
            for rel in sorted(new - set(last)) + last:
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(stage / rel, folder / rel)
            _remove_files(folder, old - new)
            _record(folder, kind, new)
    finally:
        files.remove(stage)


def clear(folder: Path | str, kind: Kind) -> None:
    """Remove the generation of `kind` in `folder` and nothing else; the folder goes too when that empties it, else
    it keeps a record of no files (so it still takes the next generation)."""
    folder = Path(folder)
    old = written(folder, kind)
    if old is None:
        return
    with files.faults_named(folder):
        _remove_files(folder, old)
        if any(p.name != RECORD for p in folder.iterdir()):
            _record(folder, kind, set())
        else:
            (folder / RECORD).unlink(missing_ok=True)
            folder.rmdir()
