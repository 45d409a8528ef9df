"""The one way every figure is finished and written (tight layout, 110 dpi PNG, atomically, figure closed), the one
way a log axis is labelled, the one way an empty panel says why it is empty, and the one home of the colours of the
sink classes and locations (the PNGs, the report pages and the leaderboard all read them from here)."""

from __future__ import annotations

import html
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import matplotlib

# Files only, no window, for the commands; a notebook's kernel keeps its own (inline) backend, and MPLBACKEND wins.
# Every module that draws imports this one first.
if "ipykernel" not in sys.modules and "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from vitsinks.utils import files  # noqa: E402

# The sink classes (diagnostics.rules.CLASSES; `other` is the interventions' name for an unclassified event) and the
# whole-model edits of the interventions report; the locations of a sink (diagnostics.summary.LOCATIONS).
CLASS_COLORS = {"nop": "#7f7f7f", "broadcast": "#ff7f0e", "unclassified": "#2ca02c", "other": "#2ca02c",
                "model": "#9467bd", "all": "#000000"}
CLASS_LABELS = {"nop": "NOP-like", "broadcast": "broadcast-like", "unclassified": "unclassified",
                "other": "unclassified", "model": "whole model (register edits)", "all": "all sinks"}
LOCATION_COLORS = {"cls": "#d62728", "register": "#9467bd", "patch": "#1f77b4"}
LOCATION_LABELS = {"cls": "[CLS]", "register": "register", "patch": "patch"}
EXTRA_KEY_COLORS = ("#8c564b", "#e377c2", "#bcbd22", "#17becf")  # the key layout's extra slots, in order
EMPTY_COLOR = "#444444"


def location_style(locations: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(colours, labels) of every location of a key layout (`KeyLayout.locations`): the tokens' fixed ones, then
    one colour per extra key slot, labelled "<slot> key"."""
    extra = [name for name in locations if name not in LOCATION_COLORS]
    colors = {**LOCATION_COLORS, **{n: EXTRA_KEY_COLORS[i % len(EXTRA_KEY_COLORS)] for i, n in enumerate(extra)}}
    return colors, {**LOCATION_LABELS, **{n: f"{n} key" for n in extra}}


def save_figure(fig: plt.Figure, path: Path, title: str | None = None, title_size: int = 10) -> Path:
    """Add `title` (a suptitle), lay out, write `path` as PNG atomically and close the figure."""
    if title:
        fig.suptitle(title, fontsize=title_size)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    with files.atomic_open(Path(path), "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    return Path(path)


def log_axis(ax: plt.Axes, values: Sequence[float], which: str = "y") -> None:
    """A log axis (`which`: y or x) with plain tick labels (1, 2, 5, 10, ...; fewer on an x axis over a wide range);
    `values` within a factor of 4 of each other get 1.5 x of room on each side, so that labelled ticks are in view."""
    if not (pos := [v for v in values if v is not None and v > 0]):
        return
    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    lo, hi = min(pos), max(pos)
    narrow = hi / lo < 10 and which == "y"
    if hi / lo < 4:
        (ax.set_ylim if which == "y" else ax.set_xlim)(lo / 1.5, hi * 1.5)
    subs = tuple(range(1, 10)) if narrow else (1.0, 2.0, 5.0) if which == "y" or hi / lo < 30 else (1.0,)
    axis.set_major_locator(ticker.LogLocator(subs=subs))
    axis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    axis.set_minor_formatter(ticker.NullFormatter())


def empty_note(ax: plt.Axes, text: str, clear: bool = True, size: int = 9) -> None:
    """Say in words, in the middle of `ax`, why it shows nothing (`clear`: without its ticks and frame)."""
    if clear:
        ax.set_xticks([])
        ax.set_yticks([])
        for side in ax.spines.values():
            side.set_visible(False)
    width = ax.get_position().width * cast(Figure, ax.figure).get_figwidth() * 72  # points (no sub-figures here)
    text = "\n".join(textwrap.wrap(text, max(12, int(width / (0.55 * size)))))
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=size, color=EMPTY_COLOR, transform=ax.transAxes,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85})


def annotate_cells(ax: plt.Axes, values: np.ndarray, most: int = 64) -> None:
    """Write each cell's value on an `imshow` heatmap (0..1 scale) when it has at most `most` cells."""
    if values.size > most:
        return
    for (r, c), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=6, color="white" if v < 0.6 else "black")


def index_ticks(ax: plt.Axes, labels: Sequence[str], most: int = 10) -> None:
    """x ticks at 0..n-1 labelled `labels`, at most `most` of them labelled (evenly spaced, the last one kept)."""
    n = len(labels)
    every = max(1, -(-n // most))
    shown = sorted({*range(0, n, every), n - 1}) if n else []
    if len(shown) > 1 and shown[-1] - shown[-2] < every:
        shown.pop(-2)  # the last label is kept, its neighbour gives way
    ax.set_xticks(shown, [labels[i] for i in shown], rotation=45 if n > 4 else 0, ha="right" if n > 4 else "center",
                  fontsize=7)


def swatches_html(names: Sequence[str], colors: dict[str, str] = CLASS_COLORS,
                  labels: dict[str, str] = CLASS_LABELS) -> str:
    """An HTML legend of `names` in their figure colours (a coloured square, then the label)."""
    items = "".join(f'<span class="swatch" data-class="{n}"><i style="display:inline-block;width:.9em;height:.7em;'
                    f'background:{colors[n]}"></i> {html.escape(labels[n])}</span> ' for n in names)
    return f'<span class="swatches">{items.strip()}</span>'
