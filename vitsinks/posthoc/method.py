"""Post-hoc edits of a trained backbone (no training): the registry of methods, each written once on the model seam
(`Backbone`), so that one implementation serves every model family (docs/trainfree.md). A derived run saves the fitted
state in its checkpoint; `reapply` puts the edit back on the loaded model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from vitsinks.backbones import sinkvit_backbone
from vitsinks.models import SinkViT
from vitsinks.models.seam import Backbone
from vitsinks.utils.registry import Registry


class TrainFreeMethod(ABC):
    """One post-hoc edit: its `name`, `label`, whether a `mitigation`, its config `group` and `count_key`."""

    name: ClassVar[str]
    label: ClassVar[str]
    mitigation: ClassVar[bool] = True
    group: ClassVar[str] = "trainfree"  # the config group of its settings
    count_key: ClassVar[str] = "fit_images"  # ... and its field giving how many images `fit` reads

    @classmethod
    @abstractmethod
    def fit(cls, backbone: Backbone, images: torch.Tensor, settings: Any) -> dict[str, Any]:
        """The state the edit needs, fitted on `images` with `settings`: tensors, numbers and lists only."""

    @classmethod
    @abstractmethod
    def apply(cls, backbone: Backbone, state: dict[str, Any]) -> Backbone:
        """Edit the backbone's model in place with a fitted `state` (a second edit is refused); return its backbone."""


METHODS: Registry[type[TrainFreeMethod]] = Registry(
    "post-hoc method", "a `TrainFreeMethod` registered with `@METHODS.register` in a module of `plugins=` "
    "(docs/extending.md)", order="sorted")


def method(name: str) -> type[TrainFreeMethod]:
    """The registered method `name`, or a `BadValue` listing them."""
    return METHODS.get(name)


def mitigations() -> list[str]:
    """The names of the training-free mitigations (methods shown as leaderboard rows)."""
    return [n for n, m in METHODS.items() if m.mitigation]


def edited_variant(variant: str, trainfree: Any) -> str:
    """A run's variant with its post-hoc edit: `base + test-time register` (unchanged without one)."""
    name = (trainfree or {}).get("method") if isinstance(trainfree, dict) else getattr(trainfree, "method", None)
    return f"{variant} + {METHODS[name].label if name in METHODS else name}" if name else variant


def reapply(model: SinkViT, name: str, state: dict[str, Any]) -> SinkViT:
    """A derived run's edit `name` put back on its loaded `SinkViT` with the saved `state` (its module imported)."""
    return method(name).apply(sinkvit_backbone(model), state).model  # type: ignore[return-value]
