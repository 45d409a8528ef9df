"""Datasets: the procedural `synthetic` default, offline `fashion_mnist`, and ImageFolder `imagenet`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from omegaconf import DictConfig
from torch.utils.data import Dataset

from vitsinks.configs.schema import DataConfig
from vitsinks.data.classification import CLASSIFICATION, build_classification, check_root, num_classes
from vitsinks.data.fashion_mnist import DEFAULT_ROOT as FASHION_MNIST_ROOT
from vitsinks.data.fashion_mnist import FashionMNIST
from vitsinks.data.imagefolder import BadImage, ImageFolderSplit, read_item
from vitsinks.data.segmentation import SEGMENTATION, build_seg_dataset
from vitsinks.data.sinktasks import SinkTask, is_sink_task
from vitsinks.data.synthetic import SyntheticShapes
from vitsinks.utils.errors import BadValue

DATASETS = CLASSIFICATION + SEGMENTATION

__all__ = ["DATASETS", "FASHION_MNIST_ROOT", "BadImage", "FashionMNIST", "ImageFolderSplit", "SinkTask",
           "SyntheticShapes", "build_dataset", "check_root", "is_sink_task", "loader_workers", "num_classes",
           "read_item"]


def build_dataset(cfg: DataConfig, split: str, seed: int = 0) -> Dataset:
    """The `(PIL image, label)` dataset of `split` (train | val) named by `cfg.name` (ADE20K / VOC: the label is
    the label map); fails early on a bad root."""
    if cfg.name in SEGMENTATION:  # the segmentation sets' images (with their label maps) for the analyses
        return build_seg_dataset(cfg, split, seed)
    if cfg.name in CLASSIFICATION:
        return build_classification(cfg, split, seed)
    raise BadValue(f"unknown data.name {cfg.name!r}; choose one of {DATASETS}")


def usable_cpus() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def loader_workers(requested: int | None) -> int:
    """DataLoader workers: `data.num_workers`, or (None) at most 8 and at most the CPUs this process may use - 1."""
    if requested is not None:
        return requested
    return max(0, min(8, usable_cpus() - 1))


def compute_threads(requested: int | None, workers: int) -> int:
    """CPU training's intra-op threads: `train.cpu_threads`, else `OMP_NUM_THREADS` when set, else the usable CPUs
    (shared among the ranks on this machine, `LOCAL_WORLD_SIZE`) minus the loader `workers`, at least 1. More
    threads than free cores make every parallel region wait for a thread that has no core (measured on 2 cores with
    2 threads and 1 worker: 4-6x the CPU time per step when the machine is loaded)."""
    if requested is not None:
        return requested
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():  # set by the user, or by torchrun for each rank
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)  # processes sharing this machine's CPUs
    return max(1, usable_cpus() // max(1, ranks) - workers)


def runs_on_cpu(cfg: DictConfig) -> bool:
    """This process computes on the CPU: `cluster.device` is cpu, or auto without CUDA, and it is not a command that
    only submits to SLURM."""
    if cfg.cluster.name == "slurm":
        return False
    return cfg.cluster.device == "cpu" or (cfg.cluster.device == "auto" and not torch.cuda.is_available())


@contextmanager
def cpu_threads(cfg: DictConfig, device: torch.device) -> Iterator[int]:
    """Within the block, torch's intra-op threads are `compute_threads` of `cfg` (train.cpu_threads, data.num_workers)
    when `device` is the CPU; the caller's count is restored after it. Yields the count in force."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(compute_threads(cfg.train.cpu_threads, loader_workers(cfg.data.num_workers)))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
