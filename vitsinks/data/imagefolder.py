"""ImageNet-1k (or any dataset) in ImageFolder layout: `<root>/<split>/<class>/*.JPEG`."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import find_classes, has_file_allowed_extension

from vitsinks.utils.errors import BadValue, InputNotFound, UserError
from vitsinks.utils.files import atomic_open

log = logging.getLogger(__name__)


class BadImage(UserError):
    """An image file that cannot be decoded."""


def strict_loader(path: str) -> Image.Image:
    """Open and fully decode an image as RGB; a corrupt or unreadable file raises `BadImage` naming it."""
    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except (OSError, ValueError, SyntaxError) as err:
        raise BadImage(f"cannot decode image {path}: {err}") from err


def read_item(dataset: Dataset, index: int, on_bad_image: str = "skip") -> Any:
    """`dataset[index]`; an unreadable image is None (a warning) under `skip`, or `BadImage` under `error`."""
    try:
        return dataset[index]
    except BadImage as err:
        if on_bad_image == "error":
            raise BadImage(f"{err} (set data.on_bad_image=skip to skip such files)") from err
        log.warning("skipping %s", err)
        return None


def train_classes(root: str | Path) -> list[str]:
    """The class folders of `<root>/train` (torchvision's order), without scanning their images."""
    folder = Path(root) / "train"
    if not folder.is_dir():
        raise InputNotFound(f"no 'train' split at {folder}: the train split's class folders number the labels of "
                            f"every split")
    return find_classes(str(folder))[0]


CACHE_VERSION = 1
SETTLED_S = 2.0  # a folder modified this recently may change within its mtime's tick: its listing is not cached


def scan_folder(directory: str, class_to_idx: dict[str, int], extensions: tuple[str, ...]
                ) -> tuple[list[tuple[str, int]], dict[str, int]]:
    """torchvision's `make_dataset` walk (the same samples in the same order), with the mtime (ns) of every folder
    it listed, each taken before the listing."""
    samples: list[tuple[str, int]] = []
    mtimes: dict[str, int] = {directory: os.stat(directory).st_mtime_ns}  # its listing: the class folders

    def walk(top: str, out: list[tuple[str, list[str]]]) -> None:  # os.walk(top, followlinks=True)
        try:
            mtimes[top] = os.stat(top).st_mtime_ns
            with os.scandir(top) as it:
                entries = list(it)
        except OSError:
            mtimes[top] = -1  # os.walk skips a folder it cannot list; such a list is not cached
            return
        files: list[str] = []
        dirs: list[str] = []
        for e in entries:
            try:
                is_dir = e.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(e.name)
        out.append((top, files))
        for d in dirs:
            walk(os.path.join(top, d), out)

    for target_class in sorted(class_to_idx):
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        listed: list[tuple[str, list[str]]] = []
        walk(target_dir, listed)
        for root, fnames in sorted(listed):
            samples += [(os.path.join(root, f), class_to_idx[target_class]) for f in sorted(fnames)
                        if has_file_allowed_extension(os.path.join(root, f), extensions)]
    return samples, mtimes


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class FileListCache:
    """The file list of an ImageFolder split, cached under `folder` per (split folder, classes, extensions): a JSON
    header with the mtime of every folder listed, then `label<TAB>relative path` lines; used only while every folder
    has its recorded mtime, written only when none changed during the scan or just before it."""

    def __init__(self, folder: str | Path, directory: str, class_to_idx: dict[str, int],
                 extensions: tuple[str, ...]) -> None:
        self.directory = directory
        ident = json.dumps([CACHE_VERSION, os.path.realpath(directory), sorted(class_to_idx.items()), extensions])
        self.ident = json.loads(ident)  # as the header reads back
        digest = hashlib.sha256(ident.encode()).hexdigest()[:20]
        self.path = Path(folder) / f"imagefolder-{digest}.tsv"

    def load(self) -> list[tuple[str, int]] | None:
        """The cached samples, or None when there is no cache or it is stale or unreadable."""
        try:
            with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
                head = json.loads(f.readline())
                if head.get("ident") != self.ident or any(
                        _mtime(os.path.join(self.directory, d)) != m for d, m in head["mtimes"].items()):
                    return None
                prefix = os.path.join(self.directory, "")
                samples = [(prefix + rel, int(label)) for label, rel in (line[:-1].split("\t", 1) for line in f)]
        except (OSError, ValueError, KeyError, AttributeError):
            return None
        return samples if len(samples) == head["count"] else None  # else a truncated file

    def save(self, samples: list[tuple[str, int]], mtimes: dict[str, int], started_ns: int) -> bool:
        """Write the list atomically; False (nothing written) when it may be stale or a path holds a tab or newline."""
        if any(m < 0 or m > started_ns - SETTLED_S * 1e9 or _mtime(d) != m for d, m in mtimes.items()) or any(
                "\t" in p or "\n" in p for p, _ in samples):
            log.info("the file list of %s is not cached: it changed during or just before the scan", self.directory)
            return False
        head = {"ident": self.ident, "count": len(samples),
                "mtimes": {os.path.relpath(d, self.directory): m for d, m in mtimes.items()}}
        cut = len(os.path.join(self.directory, ""))  # every path is os.path.join(directory, ...)
        try:  # a temp file of its own per writer: ranks may write at once
            with atomic_open(self.path, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(json.dumps(head) + "\n")
                f.writelines(f"{label}\t{p[cut:]}\n" for p, label in samples)
        except OSError as err:
            log.warning("cannot cache the file list of %s in %s (set data.file_list_cache): %s", self.directory,
                        self.path.parent, err)
            return False
        return True


class ImageFolderSplit(ImageFolder):
    """torchvision's ImageFolder on `<root>/<split>`, with a loader that reports corrupt files clearly. `classes`:
    the class list that numbers the labels (the train split's; other class folders are a `BadValue`); `cache`: a
    folder for the file list (`FileListCache`; None: no cache)."""

    def __init__(self, root: str | Path, split: str = "train", classes: list[str] | None = None,
                 cache: str | Path | None = None) -> None:
        self.expected_classes, self.cache = classes, cache
        folder = Path(root) / split
        if not folder.is_dir():
            raise InputNotFound(f"no {split!r} split at {folder}: data.root must hold {split}/<class>/<images> "
                                f"(ImageNet: train/n01440764/*.JPEG, val/n01440764/*.JPEG)")
        try:
            super().__init__(str(folder), loader=strict_loader, allow_empty=classes is not None)
        except FileNotFoundError as err:
            raise InputNotFound(f"{folder} has no class folders with images: expected {folder}/<class>/<image "
                                f"files> ({err})") from err

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        found, _ = super().find_classes(directory)
        if self.expected_classes is not None and found != list(self.expected_classes):
            missing = sorted(set(self.expected_classes) - set(found))
            extra = sorted(set(found) - set(self.expected_classes))
            raise BadValue(
                f"the class folders of {directory} differ from the train split's ("
                + ", ".join(part for part in (f"missing: {' '.join(missing[:5])}" if missing else "",
                                              f"not in train: {' '.join(extra[:5])}" if extra else "") if part)
                + "): labels are numbered from the train split's classes, so every split needs the same class "
                "folders (an empty folder is fine)")
        classes = list(self.expected_classes) if self.expected_classes is not None else found
        return classes, {c: i for i, c in enumerate(classes)}

    def make_dataset(self, directory: str | Path, class_to_idx: dict[str, int],
                     extensions: tuple[str, ...] | None = None, is_valid_file: Callable[[str], bool] | None = None,
                     allow_empty: bool = False) -> list[tuple[str, int]]:
        """torchvision's file list, read from / written to the cache when there is one."""
        if self.cache is None or extensions is None or is_valid_file is not None:
            return super().make_dataset(directory, class_to_idx, extensions, is_valid_file, allow_empty)
        directory = os.path.expanduser(str(directory))
        cache = FileListCache(self.cache, directory, class_to_idx, extensions)
        if (samples := cache.load()) is not None:
            return samples
        started = time.time_ns()
        samples, mtimes = scan_folder(directory, class_to_idx, extensions)
        present = {label for _, label in samples}
        empty = sorted(c for c, i in class_to_idx.items() if i not in present)
        if empty and not allow_empty:  # torchvision's check and message
            raise FileNotFoundError(f"Found no valid file for the classes {', '.join(empty)}. Supported extensions "
                                    f"are: {', '.join(extensions)}")
        cache.save(samples, mtimes, started)
        return samples
