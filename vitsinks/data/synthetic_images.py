"""The embedded default dataset: procedural textured shapes on textured, cluttered backgrounds.

Every image is a pure function of (seed, index). A class is a (shape, texture) pair with its own hue; each image has
one main object (its label) and up to two smaller distractors; the mask holds 0 for background, else `class + 1`.
"""

from __future__ import annotations

import colorsys

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from vitsinks.utils.errors import BadValue

SHAPES = ("disk", "square", "triangle", "ring", "cross", "diamond", "star", "hexagon", "half_disk", "ellipse")
TEXTURES = ("stripes", "checker", "dots", "waves")


def _shape_mask(shape: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Inside-test of a unit-size shape in object-local coordinates."""
    r = np.hypot(x, y)
    if shape == "disk":
        return r < 1
    if shape == "square":
        return np.maximum(abs(x), abs(y)) < 0.85
    if shape == "triangle":
        return (y < 0.75) & (y > 1.7 * abs(x) - 0.95)
    if shape == "ring":
        return (r < 1) & (r > 0.55)
    if shape == "cross":
        return ((abs(x) < 0.33) & (abs(y) < 1)) | ((abs(y) < 0.33) & (abs(x) < 1))
    if shape == "diamond":
        return abs(x) + abs(y) < 1.1
    if shape == "star":
        return r < 0.55 + 0.45 * np.cos(5 * np.arctan2(y, x))
    if shape == "hexagon":
        return np.maximum(abs(x) * 0.866 + abs(y) * 0.5, abs(y)) < 0.9
    if shape == "half_disk":
        return (r < 1) & (y > -0.2)
    return (x / 1.0) ** 2 + (y / 0.55) ** 2 < 1  # ellipse


def _texture(texture: str, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A two-tone pattern in [0, 1] in object-local coordinates."""
    f = rng.uniform(3.0, 5.0)
    if texture == "stripes":
        return (np.sin(f * 2 * x) > 0).astype(np.float32)
    if texture == "checker":
        return ((np.floor(f * 0.6 * x) + np.floor(f * 0.6 * y)) % 2).astype(np.float32)
    if texture == "dots":
        return (np.hypot((f * 0.6 * x) % 1 - 0.5, (f * 0.6 * y) % 1 - 0.5) < 0.3).astype(np.float32)
    return 0.5 + 0.5 * np.sin(f * 2 * x + 2 * np.sin(f * y))  # waves


def class_spec(k: int, num_classes: int) -> tuple[str, str, float]:
    """(shape, texture, hue) of class k."""
    return SHAPES[k % len(SHAPES)], TEXTURES[(k // len(SHAPES)) % len(TEXTURES)], (k / num_classes) % 1.0


def _rgb(hue: float, sat: float, val: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(hue % 1.0, sat, val), dtype=np.float32)


def render(seed: int, index: int, size: int, num_classes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Draw image `index`: (uint8 HxWx3 image, uint8 HxW mask, label)."""
    rng = np.random.default_rng([seed, index])
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size
    gx, gy = np.meshgrid(coords, coords)

    # background: smooth colour noise from a few random plane waves, plus random strokes
    img = np.zeros((size, size, 3), np.float32)
    for _ in range(3):
        fx, fy, ph = rng.uniform(-6, 6), rng.uniform(-6, 6), rng.uniform(0, 2 * np.pi)
        wave = 0.5 + 0.5 * np.sin(2 * np.pi * (fx * gx + fy * gy) / 3 + ph)
        img += wave[..., None] * _rgb(rng.uniform(), rng.uniform(0.1, 0.5), rng.uniform(0.2, 0.5)) / 3
    for _ in range(rng.integers(2, 6)):
        a, b, c = rng.normal(size=3)
        line = abs(a * (gx - 0.5) + b * (gy - 0.5) + 0.3 * c) / np.hypot(a, b) < rng.uniform(0.004, 0.015)
        img[line] = _rgb(rng.uniform(), 0.3, rng.uniform(0.3, 0.9))

    mask = np.zeros((size, size), np.uint8)
    label = int(rng.integers(num_classes))
    others = [k for k in range(num_classes) if k != label] or [label]
    objects = [(int(rng.choice(others)), rng.uniform(0.1, 0.16)) for _ in range(rng.integers(0, 3))]
    objects.append((label, rng.uniform(0.24, 0.34)))  # the main object is drawn last, on top
    for k, radius in objects:
        shape, texture, hue = class_spec(k, num_classes)
        cx, cy = rng.uniform(radius, 1 - radius, size=2)
        theta = rng.uniform(0, 2 * np.pi)
        ct, st = np.cos(theta), np.sin(theta)
        lx = ((gx - cx) * ct + (gy - cy) * st) / radius
        ly = (-(gx - cx) * st + (gy - cy) * ct) / radius
        inside = _shape_mask(shape, lx, ly)
        pattern = _texture(texture, lx, ly, rng)[..., None]
        c1 = _rgb(hue + rng.normal(0, 0.02), rng.uniform(0.6, 0.9), rng.uniform(0.75, 1.0))
        c2 = _rgb(hue + 0.5 + rng.normal(0, 0.02), rng.uniform(0.3, 0.6), rng.uniform(0.2, 0.45))
        obj = pattern * c1 + (1 - pattern) * c2
        img[inside] = obj[inside]
        mask[inside] = k + 1
    # pixel noise last, from its own stream: the scene above does not depend on the resolution
    img += np.random.default_rng([seed, index, 1]).normal(0, 0.03, img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8), mask, label


class SyntheticShapes(Dataset):
    """`(PIL image, label)` pairs of the procedural dataset; `masks(i)` gives the per-pixel labels."""

    def __init__(self, size: int = 64, length: int = 4096, num_classes: int = 10, seed: int = 0) -> None:
        if num_classes < 2:
            raise BadValue(f"synthetic data needs at least 2 classes, got {num_classes}")
        self.size, self.length, self.num_classes, self.seed = size, length, num_classes, seed

    def __len__(self) -> int:
        return self.length

    def sample(self, index: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(image, mask, label) arrays of item `index`."""
        if not 0 <= index < self.length:
            raise IndexError(index)
        return render(self.seed, index, self.size, self.num_classes)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        img, _, label = self.sample(index)
        return Image.fromarray(img), label

    @property
    def targets(self) -> list[int]:
        return [self.sample(i)[2] for i in range(self.length)]
