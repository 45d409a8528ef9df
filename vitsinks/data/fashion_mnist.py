"""Fashion-MNIST read offline from IDX files (Debian package `dataset-fashion-mnist`)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from vitsinks.utils.errors import BadValue, InputNotFound

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_FILES = {"train": "train", "val": "t10k"}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX array (optionally gzipped): big-endian header with the dims, then unsigned bytes."""
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise BadValue(f"{path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise BadValue(f"{path} is truncated: header says {shape}, found {data.size} values")
    return data.reshape(shape)


def _find(root: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (root / name).is_file():
            return root / name
    raise InputNotFound(f"Fashion-MNIST file {stem}(.gz) not found in {root}: install it with `apt-get install "
                        f"dataset-fashion-mnist` or point data.root at a folder holding the four IDX files")


class FashionMNIST(Dataset):
    """`(PIL RGB image, label)` pairs; 28x28 grey images are upsampled to `size` and replicated to 3 channels."""

    classes = CLASSES

    def __init__(self, root: str | Path = DEFAULT_ROOT, split: str = "train", size: int = 64) -> None:
        root = Path(root)
        stem = _FILES[split]
        self.files = [_find(root, f"{stem}-images-idx3-ubyte"), _find(root, f"{stem}-labels-idx1-ubyte")]
        self.images = read_idx(self.files[0])
        self.labels = read_idx(self.files[1]).astype(np.int64)
        if len(self.images) != len(self.labels):
            raise BadValue(f"{root}: {len(self.images)} images but {len(self.labels)} labels in split {split}")
        self.size = size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        img = Image.fromarray(self.images[index]).resize((self.size, self.size), Image.Resampling.BICUBIC)
        img = img.convert("RGB")
        return img, int(self.labels[index])

    @property
    def targets(self) -> list[int]:
        return self.labels.tolist()
