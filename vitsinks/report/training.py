"""The training run's own results, read from `metrics.jsonl` (`vitsinks.utils.metrics_log`): the online probe of
LeJEPA runs, the SSL monitors (k-NN top-1 and RankMe, `vitsinks.objectives.monitors`) and the sink tasks' fit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from omegaconf import DictConfig, OmegaConf

from vitsinks.objectives.monitors import KNN, RANKME
from vitsinks.probes.probe_results import ONLINE_PROBE
from vitsinks.utils import files
from vitsinks.utils.results import RESULTS, Column, Probed, Result
from vitsinks.utils.rundir import RunDir


def metrics(run: RunDir) -> list[dict[str, Any]]:
    """Every record of `run`'s metrics.jsonl (none without one); a torn line is a `BadFile`."""
    if not run.metrics.is_file():
        return []
    return files.read_jsonl(run.metrics, f"train {run.name} again (the training writes its metrics.jsonl)")


@dataclass
class _LastMetric(Result):
    """The last logged value of one metric, in % unless `percent` says otherwise (NaN if never logged)."""

    metric: ClassVar[str] = ""
    column: ClassVar[Column]

    value: float

    def to_json(self) -> dict[str, Any]:
        return {self.metric: self.value}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> _LastMetric:
        return cls(obj.get(cls.metric, math.nan))

    @classmethod
    def columns(cls) -> list[Column]:
        return [cls.column]

    @classmethod
    def percent(cls, value: float) -> float:
        """The column's value from the logged one."""
        return 100 * value

    @classmethod
    def collect(cls, run: RunDir) -> dict[str, Any]:
        logged = [m[cls.metric] for m in metrics(run) if cls.metric in m]
        return {cls.column.key: cls.percent(logged[-1]) if logged else math.nan}

    @classmethod
    def probed(cls, run: RunDir) -> dict[str, Probed]:
        """A probe trained with the run (`Column.probe`): the run's seed, and its last validation is `last.pt`'s."""
        if not cls.column.probe or math.isnan(cls.collect(run)[cls.column.key]):
            return {}
        seed = cast(DictConfig, OmegaConf.load(run.config)).get("seed")  # a run's config: a mapping
        return {cls.column.key: Probed(seed, run.last.name)}


@RESULTS.register
@dataclass
class OnlineProbe(_LastMetric):
    """The online probe's last validation top-1 (LeJEPA runs)."""

    kind = "online_probe"
    rank = 10
    metric = "val/probe_acc"
    column = Column("online_top1", "online probe top-1", "quality", higher_is_better=True, probe=ONLINE_PROBE)


# The monitors' protocols as their columns name them (`Column.probe`): each its own, never a probe's column
KNN_PROTOCOL, RANKME_PROTOCOL = "knn@val", "rankme@val"


@RESULTS.register
@dataclass
class KnnMonitor(_LastMetric):
    """The online k-NN's last validation top-1 (`monitors.knn_*`), in %."""

    kind = "knn_monitor"
    rank = 11
    metric = KNN
    column = Column("knn_top1", "k-NN top-1", "quality", higher_is_better=True, section="monitors",
                    probe=KNN_PROTOCOL)


@RESULTS.register
@dataclass
class RankMeMonitor(_LastMetric):
    """RankMe of the last validation's embeddings (`monitors.rankme`): an effective rank, not a %."""

    kind = "rankme_monitor"
    rank = 12
    metric = RANKME
    # not a quality column: no direction is better (a random network's rank is high), nothing is marked
    column = Column("rankme", "RankMe", "mechanism", section="monitors", probe=RANKME_PROTOCOL)

    @classmethod
    def percent(cls, value: float) -> float:
        return value


@RESULTS.register
@dataclass
class TaskFit(_LastMetric):
    """The sink tasks' fit: 100 x (1 - the last validation relative error)."""

    kind = "task_fit"
    rank = 40
    metric = "val/rel_error"
    column = Column("task_fit", "task fit (1 - rel. error)", "quality", higher_is_better=True)

    @classmethod
    def percent(cls, value: float) -> float:
        return 100 * (1 - value)
