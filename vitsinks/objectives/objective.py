"""The interface between the Trainer and a training objective, and the registry of objectives (`objective.name`);
the common-mode penalty (`objective.cm_penalty`) is added here for every objective."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import Dataset

from vitsinks.models import SinkBlock, SinkViT
from vitsinks.objectives.monitors import Embedded, Monitors
from vitsinks.objectives.penalty import CommonModePenalty
from vitsinks.utils.registry import Registry

# (inputs, targets, number of unreadable items) of one loader batch
Batch = tuple[list[torch.Tensor], Any, int]
# (the total loss to minimise, the logged terms: the first is `loss`)
StepTerms = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class Runtime:
    """Where an objective computes: the device, bf16 autocast or not, the number of ranks."""

    device: torch.device
    bf16: bool = False
    world: int = 1

    def autocast(self) -> AbstractContextManager:
        """bf16 autocast on this device when the run asks for it (a no-op context otherwise)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)


class Objective(ABC):
    """One training objective, registered with `@OBJECTIVES.register` under its `name`. `probe_prefixes`: an online
    probe's parameter prefixes (`objective.probe_lr`); `bar_metric`: on the progress bar; `nan_advice`: the fix."""

    name: ClassVar[str]
    probe_prefixes: ClassVar[tuple[str, ...]] = ()
    bar_metric: ClassVar[str | None] = None
    nan_advice: ClassVar[str] = "Lower train.lr"

    def __init__(self, cfg: DictConfig, runtime: Runtime) -> None:
        self.cfg, self.runtime = cfg, runtime
        self.penalty: CommonModePenalty | None = None
        self.monitors: Monitors | None = None  # set by `watch`

    @abstractmethod
    def train_samples(self, base: Dataset) -> Dataset:
        """The training items built from the base training split (an `epoch` attribute the Trainer sets)."""

    @abstractmethod
    def collate(self, items: list[Any]) -> Batch:
        """A loader batch from items (None for an unreadable one): (inputs, targets, number dropped)."""

    @abstractmethod
    def build_model(self, backbone: SinkViT, num_classes: int) -> nn.Module:
        """The trainable model around `backbone` (kept as its `backbone` attribute)."""

    @abstractmethod
    def loss_terms(self, net: nn.Module, inputs: list[torch.Tensor], targets: Any) -> StepTerms:
        """(total loss, logged terms) of one batch through `net` (the model, or its DDP / compiled wrapper)."""

    def setup_model(self, backbone: SinkViT, num_classes: int) -> nn.Module:
        """`build_model` on the run's device, with the common-mode penalty's hooks when `objective.cm_penalty` is on."""
        model = self.build_model(backbone, num_classes).to(self.runtime.device)
        if self.cfg.objective.cm_penalty:
            self.penalty = CommonModePenalty(cast("list[SinkBlock]", backbone.blocks), self.cfg.objective)
        return model

    def step_terms(self, net: nn.Module, inputs: list[torch.Tensor], targets: Any) -> StepTerms:
        """`loss_terms` plus the common-mode penalty of the same forward passes."""
        if self.penalty is not None:
            self.penalty.reset()
        total, terms = self.loss_terms(net, inputs, targets)
        if self.penalty is not None:
            extra, cm_terms = self.penalty()
            total = total + extra
            terms.update(cm_terms)
        return total, terms

    @abstractmethod
    def validate(self, model: nn.Module, val_set: Dataset) -> dict[str, float]:
        """Validation metrics (`val/...`) of `model` on the validation split, with the monitors' (`monitored`)."""

    def val_view(self) -> Callable[[Any], torch.Tensor] | None:
        """The view of an image this objective validates on; None: no labelled images (no monitors)."""
        return None

    def watch(self, bank_split: Dataset, num_classes: int) -> None:
        """Compute the SSL monitors with every validation (k-NN bank from `bank_split`); a no-op without `val_view`."""
        view = self.val_view()
        if view is not None:
            self.monitors = Monitors(self.cfg, bank_split, num_classes, self.runtime.device, self.runtime.autocast,
                                     view)

    def monitored(self, backbone: nn.Module, embedded: list[Embedded],
                  shard: tuple[int, int] = (0, 1)) -> dict[str, float]:
        """The monitors' metrics of one validation's embeddings (`Monitors.__call__`; none before `watch`)."""
        return {} if self.monitors is None else self.monitors(backbone, embedded, shard)

    def extra_state(self) -> dict[str, Any]:
        """State beside the model's to save in checkpoints (none by default: checkpoints then hold no such key)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook, nothing by default
        """Restore what `extra_state` returned."""


OBJECTIVES: Registry[type[Objective]] = Registry(
    "objective", "an `Objective` registered with `@OBJECTIVES.register` in a module of vitsinks/objectives/ or "
    "of `plugins=`, with its configs/objective/<name>.yaml (docs/extending.md)", fields=("objective.name",))


def build_objective(cfg: DictConfig, runtime: Runtime) -> Objective:
    """The objective `cfg.objective.name` names, for the run `cfg`."""
    return OBJECTIVES.get(str(cfg.objective.name))(cfg, runtime)
