"""Post-hoc edits of a trained backbone (no training): the registry, and how a saved edit is put back on a model.

A method fits a small state on a few images of the checkpoint's data (`fit`) and edits a loaded model with it
(`apply`: parameters, forward hooks). A derived run (`vitsinks.trainfree.derive`) saves the source weights, the
method's name in `config.trainfree.method` and the fitted state under `trainfree` in its checkpoint;
`vitsinks.train.checkpoint.load_backbone` applies it, so diagnose, the probes and intervene read an edited model
as they read any other. Methods with `mitigation = True` are the training-free mitigations (a leaderboard row
`<variant> + <label>`); the others (simulated quantization) are analyses of the same kind of edit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, TypeVar

import torch

from vitsinks.models import SinkViT
from vitsinks.utils.errors import BadValue


class TrainFreeMethod(ABC):
    """One post-hoc edit: `name` (config value and run-name suffix), `label` (tables), `mitigation`, and where its
    settings are (`group`: `trainfree` or `quant`; `count_key`: the number of fit images in that group)."""

    name: ClassVar[str]
    label: ClassVar[str]
    mitigation: ClassVar[bool] = True
    group: ClassVar[str] = "trainfree"  # the config group of its settings
    count_key: ClassVar[str] = "fit_images"  # ... and its field giving how many images `fit` reads

    @classmethod
    @abstractmethod
    def fit(cls, model: SinkViT, images: torch.Tensor, settings: Any) -> dict[str, Any]:
        """The state the edit needs, fitted on `images` (model inputs) with `settings` (a `TrainFreeConfig` or
        `QuantConfig`): tensors, numbers and lists only (it is saved in the derived checkpoint)."""

    @classmethod
    @abstractmethod
    def apply(cls, model: SinkViT, state: dict[str, Any]) -> SinkViT:
        """Edit `model` in place with a fitted `state`; return it."""


M = TypeVar("M", bound=type[TrainFreeMethod])
METHODS: dict[str, type[TrainFreeMethod]] = {}


def register_method(cls: M) -> M:
    """Class decorator: add a method to `METHODS` (its name unique)."""
    if METHODS.get(cls.name, cls) is not cls:
        raise ValueError(f"two post-hoc methods are named {cls.name!r}")
    METHODS[cls.name] = cls
    return cls


def method(name: str) -> type[TrainFreeMethod]:
    """The registered method `name`, or a `BadValue` listing them."""
    if name not in METHODS:
        raise BadValue(f"unknown post-hoc method {name!r}: choose from {', '.join(sorted(METHODS))}")
    return METHODS[name]


def mitigations() -> list[str]:
    """The names of the training-free mitigations (methods shown as leaderboard rows)."""
    return [n for n, m in METHODS.items() if m.mitigation]


def edited_variant(variant: str, trainfree: Any) -> str:
    """A run's variant with its post-hoc edit: `base + test-time register` (unchanged without one)."""
    name = (trainfree or {}).get("method") if isinstance(trainfree, dict) else getattr(trainfree, "method", None)
    return f"{variant} + {METHODS[name].label if name in METHODS else name}" if name else variant
