"""The training loader: one DataLoader for the whole fit (persistent workers, the epoch carried in every item's key)
and, on CUDA, a side stream that copies the next batch while the current one trains."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from vitsinks.data.crops import EpochSampler, sample_seed


class EpochKeys(Sampler[tuple[int, int]]):
    """The indices of an `EpochSampler` as `(epoch, index)` keys: persistent workers hold a copy of the dataset made
    once, so the epoch must travel with the items."""

    def __init__(self, sampler: EpochSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.sampler.epoch
        return ((epoch, i) for i in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class EpochKeyed(Dataset):
    """`dataset[index]` at key `(epoch, index)`, with `dataset.epoch` set to that epoch first."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        self.dataset.epoch = epoch  # type: ignore[attr-defined]
        return self.dataset[index]


def train_loader(dataset: Dataset, sampler: EpochSampler, collate: Callable[[list[Any]], Any], workers: int,
                 prefetch_factor: int, device: torch.device, seed: int) -> DataLoader:
    """The DataLoader of a fit (`sampler.set_epoch` chooses what the next iteration yields); pinned for CUDA."""
    return DataLoader(EpochKeyed(dataset), batch_size=sampler.local, sampler=EpochKeys(sampler), collate_fn=collate,
                      num_workers=workers, drop_last=True, pin_memory=device.type == "cuda",
                      persistent_workers=workers > 0, prefetch_factor=prefetch_factor if workers > 0 else None,
                      generator=torch.Generator().manual_seed(sample_seed(seed, 0, 1)))  # keeps the global RNG intact


def to_device(obj: Any, device: torch.device) -> Any:
    """`obj` with its tensors on `device` (asynchronous copies), through containers; a `ViewBatch` moves itself."""
    if isinstance(obj, torch.Tensor) or (hasattr(obj, "to") and hasattr(obj, "_fields")):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(o, device) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


class CudaPrefetcher:
    """Batches of `loader` already on the GPU: batch k + 1 is copied on a side stream while batch k trains."""

    def __init__(self, loader: Iterable[Any], device: torch.device) -> None:
        self.loader, self.device = loader, device
        self.stream = torch.cuda.Stream(device)

    def _copy(self, it: Iterator[Any]) -> Any:
        batch = next(it, None)
        if batch is None:
            return None
        with torch.cuda.stream(self.stream):
            return to_device(batch, self.device)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        ahead = self._copy(it)
        while ahead is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            for t in _tensors(ahead):
                if t.device.type == "cuda":
                    t.record_stream(current)  # made on the side stream, used on this one: freed only after
            batch, ahead = ahead, self._copy(it)
            yield batch


def device_batches(loader: DataLoader, device: torch.device) -> Iterable[Any]:
    """The loader's batches; on CUDA through a `CudaPrefetcher` (their tensors arrive on the GPU)."""
    return CudaPrefetcher(loader, device) if device.type == "cuda" else loader
