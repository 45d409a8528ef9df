"""The CPU-thread policy: how many loader workers and compute threads a process uses on the CPUs it may use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from omegaconf import DictConfig


def usable_cpus() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def loader_workers(requested: int | None) -> int:
    """DataLoader workers: `data.num_workers`, or (None) at most 8 and at most the CPUs this process may use - 1."""
    return requested if requested is not None else max(0, min(8, usable_cpus() - 1))


def compute_threads(requested: int | None, workers: int) -> int:
    """CPU training's intra-op threads: `train.cpu_threads`, else `OMP_NUM_THREADS`, else this rank's share of the
    usable CPUs minus the loader `workers`, at least 1 (a thread without a free core slows every parallel region)."""
    if requested is not None:
        return requested
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():  # set by the user, or by torchrun for each rank
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)  # processes sharing this machine's CPUs
    return max(1, usable_cpus() // max(1, ranks) - workers)


def runs_on_cpu(cfg: DictConfig) -> bool:
    """This process computes on the CPU: `cluster.device` is cpu (or auto without CUDA), not submitting to SLURM."""
    device = cfg.cluster.device
    return cfg.cluster.name != "slurm" and (device == "cpu" or (device == "auto" and not torch.cuda.is_available()))


@contextmanager
def cpu_threads(cfg: DictConfig, device: torch.device) -> Iterator[int]:
    """Torch's intra-op threads set to `compute_threads` within the block when `device` is the CPU; yields them."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(compute_threads(cfg.train.cpu_threads, loader_workers(cfg.data.num_workers)))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
