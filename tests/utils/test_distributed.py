"""Device resolution and the process group: the one function that turns `cluster.device` into a device, the process
group's settings, and the sharded feature extraction on 2 gloo ranks (`run_ranks`: ranks watched for progress)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.helpers.distributed import run_ranks
from vitsinks.data import BadImage
from vitsinks.probes.features import extract
from vitsinks.utils import distributed
from vitsinks.utils.distributed import PG_TIMEOUT, gather_objects, init_distributed, resolve_device
from vitsinks.utils.errors import NonFinite


def test_auto_and_named_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="cluster.device=cuda but CUDA is not available"):
        resolve_device("cuda")


def test_auto_picks_this_ranks_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("auto") == torch.device("cuda", 3) and chosen == [3]
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1) and chosen == [3, 1]


def test_one_gpu_bound_per_task_is_every_ranks_device_0(monkeypatch: pytest.MonkeyPatch) -> None:
    # SLURM's GPU binding shows each task its own GPU only: LOCAL_RANK 0-3, one visible device
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert [resolve_device("auto", r) for r in range(4)] == [torch.device("cuda", 0)] * 4 and chosen == [0] * 4
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # two tasks per node sharing two visible GPUs
    assert [resolve_device("cuda", r).index for r in range(4)] == [0, 1, 0, 1]


@pytest.mark.parametrize("cuda", [False, True])
def test_the_process_group_has_an_explicit_timeout_and_nccl_is_bound_to_the_gpu(
        monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    monkeypatch.setattr(os, "environ", {**os.environ, "WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "3"})
    info = init_distributed("auto")
    assert (info.rank, info.world, info.local_rank) == (3, 4, 3)
    assert len(calls) == 1 and calls[0]["timeout"] is PG_TIMEOUT and PG_TIMEOUT.total_seconds() == 30 * 60
    assert calls[0]["rank"] == 3 and calls[0]["world_size"] == 4
    if cuda:
        assert calls[0]["backend"] == "nccl" and calls[0]["device_id"] == torch.device("cuda", 0) == info.device
    else:
        assert calls[0]["backend"] == "gloo" and "device_id" not in calls[0] and info.device == torch.device("cpu")


def test_gather_objects_outside_a_process_group_is_the_object_alone() -> None:
    assert not distributed.is_distributed() and gather_objects({"a": 1}) == [{"a": 1}]


class Items(torch.utils.data.Dataset):
    """Item i is the vector (i, i, i); the items in `bad` are unreadable images."""

    def __init__(self, n: int, bad: frozenset[int] = frozenset()) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.bad:
            raise BadImage(f"item {i} is corrupt")
        return torch.full((3,), float(i))


def _extract_worker(rank: int, world: int, report: Callable[[str], None], tmp: str) -> None:
    cache = Path(tmp) / "f.pt"
    seen: list[int] = []

    def double(items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        seen.extend(int(x[0]) for x in items)
        x = torch.stack(items)
        return {"feat": 2 * x, "label": x[:, 0].long()}

    out = extract(Items(7, frozenset({4})), double, cache, 2, "items")
    report("extracted")
    assert seen == [i for i in range(rank, 7, world) if i != 4]  # this rank's share, once
    assert out["index"].tolist() == [0, 1, 2, 3, 5, 6] and out["label"].tolist() == [0, 1, 2, 3, 5, 6]
    assert torch.equal(out["feat"].float(), 2 * out["index"].float()[:, None].expand(-1, 3))
    assert len({str(f) for f in gather_objects(out["feat"].tolist())}) == 1  # every rank the whole, same set

    def never(items: list) -> dict[str, torch.Tensor]:
        raise AssertionError("the finished cache was not reused")

    assert torch.equal(extract(Items(7, frozenset({4})), never, cache, 2, "items")["feat"], out["feat"])
    report("reused the cache")
    assert extract(Items(1), double, Path(tmp) / "one.pt", 2, "one item")["index"].tolist() == [0]  # rank 1: none
    report("one item on two ranks")

    def nan_on_rank_1(items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        x = torch.stack(items)
        return {"feat": x * float("nan") if rank == 1 else x}

    with pytest.raises(NonFinite, match="^rank 1: the backbone's features are not finite" if rank == 0 else
                       "^the backbone's features are not finite"):
        extract(Items(4), nan_on_rank_1, Path(tmp) / "nan.pt", 2, "nan items")
    report("a failure on rank 1 raised on both")


@pytest.mark.slow
def test_extract_shards_over_two_ranks_and_every_rank_gets_the_whole_set(tmp_path: Path) -> None:
    reports = run_ranks(_extract_worker, str(tmp_path))
    assert sorted(r for r, what in reports if what == "a failure on rank 1 raised on both") == [0, 1]
    assert sorted(p.name for p in tmp_path.glob("f*")) == ["f.pt"]  # the shards are gone
    assert sorted(p.name for p in tmp_path.glob("one*")) == ["one.pt"] and not (tmp_path / "nan.pt").exists()
