"""ViT sink tasks whose right answer about sinks is known (`data=sinktask_nop`, `data=sinktask_broadcast`); each item
is a pure function of (seed, index).

Images are patch grids of Gaussian noise rescaled to one norm per patch (the content, orthogonal to the marker's
unit direction e: the first channel, every pixel); a marker `marker * e` flags special patches. Targets are per
patch, in patch-pixel space (P, C * p * p), with a weight per patch (`vitsinks.objectives.supervised` embeds them).

- `nop`: `round(marked_frac * P)` (at least 1) marked patches must receive the mean content of all patches; every
  other patch must leave the network unchanged. The marked patches carry half of the loss weight.
- `broadcast`: one source patch, flagged by the marker: its content is added to every patch.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

from vitsinks.data.crops import sample_seed
from vitsinks.utils.errors import BadValue

TASKS = ("nop", "broadcast")


class SinkTask(Dataset):
    """`(image (C, H, W), target (P, C * p * p), weight (P,))` items of one sink task."""

    def __init__(self, task: str, image_size: int = 32, patch_size: int = 4, length: int = 16384, seed: int = 0,
                 marked_frac: float = 0.03, marker: float = 3.0, channels: int = 3) -> None:
        if task not in TASKS:
            raise BadValue(f"unknown sink task {task!r}; choose one of {TASKS}")
        if image_size % patch_size:
            raise BadValue(f"sink task: image_size {image_size} is not a multiple of patch_size {patch_size}")
        self.task, self.size, self.patch, self.length, self.seed = task, image_size, patch_size, length, seed
        self.channels, self.marker = channels, marker
        self.grid = image_size // patch_size
        self.num_patches = self.grid**2
        self.n_marked = max(1, round(marked_frac * self.num_patches)) if task == "nop" else 1
        self.features = channels * patch_size**2

    def __len__(self) -> int:
        return self.length

    def _to_image(self, patches: torch.Tensor) -> torch.Tensor:
        """(P, C * p * p) patch vectors, in the order of timm's conv patch embedding -> (C, H, W) image."""
        g, p, c = self.grid, self.patch, self.channels
        return patches.view(g, g, c, p, p).permute(2, 0, 3, 1, 4).reshape(c, g * p, g * p)

    def to_patches(self, image: torch.Tensor) -> torch.Tensor:
        """Inverse of `_to_image`: (C, H, W) -> (P, C * p * p)."""
        g, p, c = self.grid, self.patch, self.channels
        return image.view(c, g, p, g, p).permute(1, 3, 0, 2, 4).reshape(g * g, c * p * p)

    def marker_direction(self) -> torch.Tensor:
        """The unit vector e (C * p * p,) that the marker adds along: the first channel, every pixel."""
        e = torch.zeros(self.features)
        e[: self.patch**2] = 1.0 / self.patch
        return e

    def sample(self, index: int) -> dict[str, torch.Tensor]:
        """Everything about one item: content, marked / source positions, image, target, weight."""
        gen = torch.Generator().manual_seed(sample_seed(self.seed, index, 0x51))
        P = self.num_patches
        e = self.marker_direction()
        content = torch.randn(P, self.features, generator=gen)
        content -= (content @ e)[:, None] * e  # orthogonal to the marker direction ...
        content *= math.sqrt(self.features - 1) / content.norm(dim=1, keepdim=True)  # ... and of one norm
        marked = torch.randperm(P, generator=gen)[: self.n_marked]
        flags = torch.zeros(P, dtype=torch.bool)
        flags[marked] = True
        patches = content + self.marker * flags[:, None].float() * e
        weight = torch.ones(P)
        if self.task == "nop":
            update = flags[:, None].float() * content.mean(0, keepdim=True)
            weight[flags] = (P - self.n_marked) / self.n_marked  # marked patches: half of the loss weight
        else:
            update = content[marked[0]].expand(P, -1)
        return {"image": self._to_image(patches), "target": patches + update, "weight": weight,
                "marked": flags, "content": content}

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.sample(index)
        return s["image"], s["target"], s["weight"]


def is_sink_task(name: str) -> bool:
    return name.startswith("sinktask_")


def sink_task_name(name: str) -> str:
    return name.removeprefix("sinktask_")
