"""The training loader: built once, persistent workers that see every epoch, the same batches as a fresh
per-epoch DataLoader (the default path unchanged), and (slow) exact resume with the device views."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate

from tests.helpers.tiny import tiny_cfg
from vitsinks.data.crops import EpochSampler, sample_seed
from vitsinks.data.device_crops import ViewBatch
from vitsinks.data.loading import device_batches, to_device, train_loader
from vitsinks.train.trainer import Trainer
from vitsinks.utils.metrics_log import read_metrics

CPU = torch.device("cpu")


class EpochEcho(Dataset):
    """Items `(epoch, index, pid)`: what the process that read the item believed the epoch was."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([self.epoch, index, os.getpid()])


def epoch_items(loader: DataLoader, sampler: EpochSampler, epoch: int, start: int = 0) -> torch.Tensor:
    sampler.set_epoch(epoch, start)
    return torch.cat(list(loader))


@pytest.mark.parametrize("workers", [0, 2])
def test_one_loader_yields_every_epoch_with_its_epoch_and_order(workers: int) -> None:
    sampler = EpochSampler(24, 8, seed=0)
    loader = train_loader(EpochEcho(24), sampler, default_collate, workers, 2, CPU, seed=0)
    seen = {}
    for epoch in (0, 1, 2, 1):
        items = epoch_items(loader, sampler, epoch)
        assert (items[:, 0] == epoch).all()  # the epoch reached whichever process read the item
        assert items[:, 1].tolist() == list(sampler)
        seen.setdefault(epoch, items[:, 1].tolist())
        assert items[:, 1].tolist() == seen[epoch]
    tail = epoch_items(loader, sampler, 2, start=1)  # mid-epoch resume
    assert tail[:, 1].tolist() == seen[2][8:] and (tail[:, 0] == 2).all()
    if workers:
        pids = [set(epoch_items(loader, sampler, e)[:, 2].tolist()) for e in (0, 1)]
        assert pids[0] == pids[1] and os.getpid() not in pids[0] and len(pids[0]) == workers  # persistent


def test_trainer_keeps_one_loader_whose_batches_equal_a_fresh_per_epoch_loaders(runs: Path) -> None:
    trainer = Trainer(tiny_cfg(runs, "data.train_size=48"))
    assert trainer.loader(0) is trainer.loader(1)  # on a CPU the DataLoader itself, built once
    for epoch in (0, 1):
        ours = list(trainer.loader(epoch))
        trainer.train_set.epoch = epoch  # what the trainer did before: a new DataLoader per epoch
        before = DataLoader(trainer.train_set, batch_size=trainer.sampler.local, sampler=trainer.sampler,
                            collate_fn=trainer.objective.collate, drop_last=True,
                            generator=torch.Generator().manual_seed(sample_seed(0, epoch, 1)))
        for (v1, y1, n1), (v2, y2, n2) in zip(ours, before, strict=True):
            assert torch.equal(y1, y2) and n1 == n2 and all(torch.equal(a, b) for a, b in zip(v1, v2, strict=True))


def test_to_device_keeps_the_structure_and_the_view_parameters_on_the_host() -> None:
    batch = ViewBatch([torch.zeros(2, 3, 4, 4, dtype=torch.uint8)], torch.ones(2, 1, 13))
    moved = to_device(([torch.ones(1)], {"y": torch.zeros(2)}, batch, 3), CPU)
    assert isinstance(moved[2], ViewBatch) and moved[2].params is batch.params and moved[3] == 3
    assert isinstance(moved[0], list) and set(moved[1]) == {"y"}
    loader = DataLoader(EpochEcho(4))
    assert device_batches(loader, CPU) is loader  # the CUDA prefetcher only on CUDA


def losses(run: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(run) if "loss" in m}


@pytest.mark.slow
def test_device_views_with_persistent_workers_resume_exactly(runs: Path) -> None:
    fast = ("views.backend=device", "data.num_workers=2")
    Trainer(tiny_cfg(runs, "name=straight", *fast)).fit()

    def stop(tr: Trainer) -> None:
        if tr.progress.step == 3:
            tr.request_stop()

    assert Trainer(tiny_cfg(runs, "name=resumed", *fast)).fit(on_step=stop)["status"] == "interrupted"
    assert Trainer(tiny_cfg(runs, "name=resumed", *fast)).fit()["status"] == "finished"
    straight, resumed = losses(runs / "straight"), losses(runs / "resumed")
    assert len(straight) == 8 and straight == resumed  # both epochs, bit for bit
