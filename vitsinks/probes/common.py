"""What the evaluation CLIs share: a seeded subset of a split, the results written once (the model, its data and
where results go: `vitsinks.run.source.for_probes`)."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset, Subset

from vitsinks.data.selection import permutation
from vitsinks.utils import files
from vitsinks.utils.distributed import rank_world
from vitsinks.utils.results import Result


def limit(ds: Dataset, n: int | None, seed: int = 0) -> Dataset:
    """`n` items of `ds`, the first n of a permutation seeded `seed` (`vitsinks.data.selection`: never the first n
    files of a class-sorted split), all when n is None or larger; keeps its `num_classes`."""
    if not n or n >= len(ds):  # type: ignore[arg-type]
        return ds
    sub = Subset(ds, permutation(len(ds), seed)[:n])  # type: ignore[arg-type]
    if hasattr(ds, "num_classes"):
        sub.num_classes = ds.num_classes  # type: ignore[attr-defined]
    return sub


def write_result(path: Path, result: Result) -> None:
    """Write a typed result's JSON atomically, once (rank 0)."""
    if rank_world()[0] == 0:
        files.write_json(path, result.to_json())
