"""The CPU-thread policy: loader workers and compute threads on the CPUs a process may use."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from vitsinks.utils import cpus


def test_loader_workers_default_fits_the_machine(monkeypatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cpus.loader_workers(None) == 1 and cpus.loader_workers(3) == 3
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert cpus.loader_workers(None) == 8


def test_cpu_training_threads_leave_a_core_to_each_loader_worker(monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 2)
    assert cpus.compute_threads(None, 1) == 1 and cpus.compute_threads(None, 0) == 2  # 2 CPUs: never 3 busy
    assert cpus.compute_threads(None, 8) == 1  # more workers than CPUs: still one compute thread
    assert cpus.compute_threads(3, 1) == 3  # train.cpu_threads wins
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 16)
    assert cpus.compute_threads(None, cpus.loader_workers(None)) == 8  # 8 workers, 8 compute threads
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 4 ranks share the 16 CPUs
    assert cpus.compute_threads(None, 1) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's (or torchrun's) setting wins over the guess
    assert cpus.compute_threads(None, 1) == 2 and cpus.compute_threads(5, 1) == 5


def test_only_a_process_that_computes_on_the_cpu_sets_threads() -> None:
    def cfg(name: str, device: str) -> DictConfig:
        return OmegaConf.create({"cluster": {"name": name, "device": device}})

    assert cpus.runs_on_cpu(cfg("local", "cpu"))
    assert not cpus.runs_on_cpu(cfg("slurm", "cpu"))  # it only submits: no device is resolved
    assert not cpus.runs_on_cpu(cfg("local", "cuda"))


def test_cpu_threads_hold_within_the_block_and_restore_after() -> None:
    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    cfg = OmegaConf.create({"train": {"cpu_threads": wanted}, "data": {"num_workers": 0}})
    with cpus.cpu_threads(cfg, torch.device("cpu")) as n:
        assert n == wanted == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with cpus.cpu_threads(cfg, torch.device("meta")):  # not the CPU: left alone
        assert torch.get_num_threads() == before
