"""Post-hoc edits of a trained backbone (no training): the registry of methods, each written once on the model seam.

A method fits a small state on a few images (`fit`) and edits a model with it (`apply`: parameters, forward hooks),
both through its `Backbone` (`vitsinks.models.seam`), so that one implementation serves every model family: vitsinks'
own `SinkViT` and every adapted pretrained ViT. A derived run (`vitsinks.run.derive`) saves the source weights,
the method's name in `config.trainfree.method` and the fitted state under `trainfree` in its checkpoint;
`reapply` puts the edit back on the loaded backbone (`vitsinks.train.checkpoint.load_backbone(path, reapply)`), so
diagnose, the probes and intervene read an edited model as they read any other. Methods with `mitigation = True` are
the training-free mitigations (a leaderboard row `<variant> + <label>`); the others (simulated quantization) are
analyses of the same kind of edit.
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
    """One post-hoc edit: `name` (config value and run-name suffix), `label` (tables), `mitigation`, and where its
    settings are (`group`: `trainfree` or `quant`; `count_key`: the number of fit images in that group)."""

    name: ClassVar[str]
    label: ClassVar[str]
    mitigation: ClassVar[bool] = True
    group: ClassVar[str] = "trainfree"  # the config group of its settings
    count_key: ClassVar[str] = "fit_images"  # ... and its field giving how many images `fit` reads

    @classmethod
    @abstractmethod
    def fit(cls, backbone: Backbone, images: torch.Tensor, settings: Any) -> dict[str, Any]:
        """The state the edit needs, fitted on `images` (model inputs) with `settings` (a `TrainFreeConfig` or
        `QuantConfig`): tensors, numbers and lists only (it is saved in the derived checkpoint)."""

    @classmethod
    @abstractmethod
    def apply(cls, backbone: Backbone, state: dict[str, Any]) -> Backbone:
        """Edit the backbone's model in place with a fitted `state` (a second edit of a kind is refused,
        `trainfree.applied`); return the edited model's backbone."""


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
    """A derived run's post-hoc edit `name` put back on its loaded `SinkViT` with the saved `state` (in place: every
    edit of vitsinks' own ViT lives in the model itself); the loader of a derived checkpoint calls it. The method's
    module must have been imported (`vitsinks.quant` for `w8a8`)."""
    return method(name).apply(sinkvit_backbone(model), state).model  # type: ignore[return-value]
