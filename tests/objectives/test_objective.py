"""The objective interface: the registry matches the config group, and the Trainer trains any registered objective
through the interface alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from tests.helpers.tiny import tiny_cfg
from vitsinks.configs.schema import config_dir, load_config
from vitsinks.data.crops import collate_views
from vitsinks.models import SinkViT
from vitsinks.objectives import OBJECTIVES, Objective, Runtime, build_objective
from vitsinks.objectives.objective import Batch, StepTerms
from vitsinks.objectives.supervised import SupervisedSamples
from vitsinks.train.trainer import Trainer
from vitsinks.utils.errors import ConfigError
from vitsinks.utils.metrics_log import read_metrics


def test_every_objective_config_selects_its_registered_objective() -> None:
    assert {p.stem for p in (config_dir() / "objective").glob("*.yaml")} == set(OBJECTIVES)
    for name, cls in OBJECTIVES.items():
        cfg = load_config([f"objective={name}"])
        objective = build_objective(cfg, Runtime(torch.device("cpu")))
        assert type(objective) is cls and objective.name == name


class MeanToZero(Objective):
    """A toy objective: drive the mean [CLS] embedding to zero; its own term and metric, no probe."""

    bar_metric = "norm"

    def train_samples(self, base: Dataset) -> Dataset:
        return SupervisedSamples(base, self.cfg.views.global_size)

    def collate(self, items: list[Any]) -> Batch:
        return collate_views([None if it is None else ((it[0],), it[1]) for it in items])

    def build_model(self, backbone: SinkViT, num_classes: int) -> nn.Module:
        return nn.ModuleDict({"backbone": backbone})

    def loss_terms(self, net: nn.Module, inputs: list[torch.Tensor], targets: Any) -> StepTerms:
        mean = net["backbone"](inputs[0]).mean(0)
        loss = mean.square().sum()
        return loss, {"loss": loss, "norm": mean.norm()}

    def validate(self, model: nn.Module, val_set: Dataset) -> dict[str, float]:
        return {"val/calls": 1.0}

    def extra_state(self) -> dict[str, Any]:
        return {"note": "kept"}


@pytest.fixture
def toy() -> Iterator[type[Objective]]:
    """`MeanToZero` registered as the objective `toy` for the test."""
    OBJECTIVES.register(MeanToZero, name="toy")
    yield MeanToZero
    OBJECTIVES.unregister("toy")


def test_the_trainer_trains_an_objective_it_does_not_know(runs: Path, toy: type[Objective]) -> None:
    trainer = Trainer(tiny_cfg(runs, "name=toy", "objective.name=toy", "train.max_steps=4", "train.lr=0.1",
                               "train.warmup_epochs=0"))
    assert isinstance(trainer.objective, MeanToZero)
    summary = trainer.fit()
    assert summary["status"] == "finished" and summary["val/calls"] == 1.0
    lines = [m for m in read_metrics(runs / "toy") if "loss" in m]
    assert [m["step"] for m in lines] == [1, 2, 3, 4] and {"loss", "norm", "lr"} <= set(lines[0])
    assert lines[-1]["loss"] < 0.8 * lines[0]["loss"]  # it learns through the interface alone
    state = torch.load(runs / "toy/checkpoints/last.pt", weights_only=False)
    assert state["objective"] == {"note": "kept"} and not any(k.startswith("probe.") for k in state["model"])


def test_the_device_views_backend_is_refused_where_there_are_no_views(runs: Path) -> None:
    cfg = tiny_cfg(runs, "objective=supervised", "views.backend=device")
    with pytest.raises(ConfigError, match="views.backend=device is for the multi-crop views"):
        build_objective(cfg, Runtime(torch.device("cpu")))
