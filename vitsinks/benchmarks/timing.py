"""Side-by-side timings (`interleaved`), their per-round ratios (`ratio_stats`) and a Markdown table of them."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping

from vitsinks.utils.tables import markdown_table


def interleaved(fns: Mapping[str, Callable[[], object]], repeats: int = 15, warmup: int = 2,
                seed: int = 0) -> dict[str, list[float]]:
    """Time each callable `repeats` times, in a shuffled order every round, after `warmup` untimed rounds."""
    order = list(fns)
    rng = random.Random(seed)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(warmup + repeats):
        rng.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            fns[name]()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def ratio_stats(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Median, 25th and 75th percentile of the per-round ratios num[i] / den[i]."""
    ratios = sorted(a / b for a, b in zip(num, den, strict=True))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return statistics.median(ratios), q[0], q[2]


def table(rows: list[list[str]], header: list[str]) -> str:
    """A Markdown table."""
    return "\n".join(markdown_table(header, rows))
