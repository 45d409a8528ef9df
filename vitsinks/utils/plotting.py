"""The one way every figure is finished and written (tight layout, 110 dpi PNG, atomically, figure closed), and the
one way a log axis is labelled."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

from vitsinks.utils import files  # noqa: E402


def save_figure(fig: plt.Figure, path: Path, title: str | None = None, title_size: int = 10) -> Path:
    """Add `title` (a suptitle), lay out, write `path` as PNG atomically and close the figure."""
    if title:
        fig.suptitle(title, fontsize=title_size)
    fig.tight_layout()
    with files.atomic_open(Path(path), "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    return Path(path)


def log_axis(ax: plt.Axes, values: Sequence[float]) -> None:
    """A log y axis with plain tick labels (1, 2, 5, 10, ...; every integer multiple within one decade); `values`
    within a factor of 4 of each other get 1.5 x of room on each side, so that labelled ticks are in view."""
    pos = [v for v in values if v is not None and v > 0]
    if not pos:
        return
    ax.set_yscale("log")
    lo, hi = min(pos), max(pos)
    narrow = hi / lo < 10
    if hi / lo < 4:
        ax.set_ylim(lo / 1.5, hi * 1.5)
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=tuple(range(1, 10)) if narrow else (1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
