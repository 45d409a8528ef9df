"""The per-epoch validation (LeJEPA's online probe): sharded over the ranks with the one-process number, and
decoded once per run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from tests.helpers.distributed import run_ranks
from tests.helpers.tiny import tiny_cfg
from vitsinks.data import build_dataset
from vitsinks.data.selection import permutation
from vitsinks.models import model_from_config
from vitsinks.objectives import Runtime, build_objective
from vitsinks.objectives.lejepa import probe_accuracy, probe_batches
from vitsinks.utils.distributed import rank_world


class Counted(Dataset):
    """A dataset that counts its reads."""

    def __init__(self, base: Dataset) -> None:
        self.base, self.reads = base, 0

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int):
        self.reads += 1
        return self.base[i]


def _setup(runs: Path, world: int = 1):
    cfg = tiny_cfg(runs, "data.val_size=37")
    runtime = Runtime(torch.device("cpu"), world=world)
    objective = build_objective(cfg, runtime)
    torch.manual_seed(0)
    model = objective.setup_model(model_from_config(cfg.model), cfg.data.num_classes)
    return cfg, runtime, objective, model, build_dataset(cfg.data, "val", cfg.seed)


def _by_hand(model, val_set, cfg) -> float:
    """Image by image, in the selection order: the truth the batched, sharded numbers must equal."""
    batches = probe_batches(val_set, cfg, batch_size=1)
    model.eval()
    with torch.no_grad():
        hits = [int(model.probe(model.backbone(x)).argmax(-1).item() == y.item()) for x, y in batches]
    return sum(hits) / len(hits)


def test_shards_cover_the_images_once_and_validation_decodes_once(runs: Path) -> None:
    cfg, runtime, objective, model, val = _setup(runs)
    labels = [val[i][1] for i in permutation(len(val), cfg.selection.seed)]
    shards = [probe_batches(val, cfg, shard=(r, 3), batch_size=5) for r in range(3)]
    got = sorted(int(y) for shard in shards for _, ys in shard for y in ys)
    assert got == sorted(labels) and len(got) == 37  # every image once, uneven shards included
    counted = Counted(val)
    first = objective.validate(model, counted)["val/probe_acc"]
    reads = counted.reads
    assert reads == 37 and objective.validate(model, counted)["val/probe_acc"] == first
    assert counted.reads == reads  # the second epoch's validation decoded nothing
    assert first == pytest.approx(_by_hand(model, val, cfg)) and 0 < first < 1


def _sharded_worker(rank: int, world: int, report, runs: str) -> None:
    cfg, runtime, objective, model, val = _setup(Path(runs), world)
    assert rank_world() == (rank, world)
    one_process = probe_accuracy(model, val, cfg, runtime)  # this rank alone, every image (no collective)
    counted = Counted(val)
    sharded = objective.validate(model, counted)["val/probe_acc"]  # a collective
    report(f"{counted.reads} {sharded == one_process} {sharded == pytest.approx(_by_hand(model, val, cfg))}")


@pytest.mark.slow
def test_two_ranks_validate_their_halves_and_both_get_the_one_process_number(tmp_path: Path) -> None:
    reports = run_ranks(_sharded_worker, str(tmp_path))
    assert sorted(what for _, what in reports if what[0].isdigit()) == ["18 True True", "19 True True"]
