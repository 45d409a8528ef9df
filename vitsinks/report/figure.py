"""The leaderboard's figure, one row per variant (grouped by task where the names say `<task> / <variant>`), every
label horizontal: each quality column (a dot per variant with its std, `*` where Welch's test marks it), sinks per
image split by class, the max / median token norm, and each variant's strongest-head sink mass per block (a heatmap
with its colour bar, where that sink sits written beside it)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from vitsinks.diagnostics.rules import CLASSES
from vitsinks.report.collect import quality
from vitsinks.report.render import mark_note, rows_note, rule_notes, significant_best, table_columns
from vitsinks.utils.plotting import CLASS_COLORS, CLASS_LABELS, annotate_cells, empty_note, log_axis, save_figure

ROW_IN, NEAR_FULL = 0.22, 99.0  # inches per row; a quality column whose every value is above this is shown as 100 - it
LABEL_CHARS, LINE_IN, NOTE_IN = 36, 0.14, 0.12  # a split row's name: characters a line, inches a line; a footnote's


def rows_of(variants: list[str]) -> tuple[list[tuple[float, str, bool]], list[float]]:
    """The y of every label (a group's name in bold, then its variants) and of every variant, top down."""
    grouped = all(" / " in v for v in variants)
    labels: list[tuple[float, str, bool]] = []
    ys: list[float] = []
    group = None
    for v in variants:
        head, _, name = v.partition(" / ") if grouped else ("", "", v)
        if grouped and head != group:
            group = head
            labels.append((len(labels), head, True))
        labels.append((len(labels), name, False))
        ys.append(labels[-1][0])
    return labels, ys


def _quality(ax: plt.Axes, table: list[dict[str, Any]], key: str, label: str, best: str | None,
             ys: list[float]) -> None:
    """One quality column: a dot and its std per variant; near 100 everywhere, 100 - value on a log axis."""
    means = np.array([t[key][0] for t in table])
    errs = np.array([0.0 if math.isnan(t[key][1]) else t[key][1] for t in table])
    short = bool(np.nanmin(means) >= NEAR_FULL)
    vals = 100 - means if short else means
    ax.errorbar(vals, ys, xerr=errs, fmt="o", ms=4, color="tab:blue", ecolor="gray", capsize=2)
    if short:
        log_axis(ax, [v for v in vals if v > 0], which="x")
    for v, y, t in zip(vals, ys, table, strict=True):
        if best == t["variant"]:
            ax.annotate("*", (v, y), xytext=(6, -4), textcoords="offset points", fontsize=12)
    ax.set_title(f"100 - {label} (log)" if short else f"{label} (%)", fontsize=8)


def _mechanism(ax: plt.Axes, table: list[dict[str, Any]], ys: list[float]) -> None:
    """Sinks per image stacked by class, in the classes' colours; in words when no variant has any."""
    left = np.zeros(len(table))
    total = np.nan_to_num([t["sinks"][0] for t in table])
    for name in CLASSES:
        vals = np.nan_to_num([t[name][0] for t in table]) if name in ("nop", "broadcast") else total - left
        ax.barh(ys, vals, 0.75, left=left, color=CLASS_COLORS[name], label=CLASS_LABELS[name])
        left += vals
    ax.set_xlim(0, max(1.0, float(total.max()) * 1.1))
    ax.xaxis.set_major_locator(MaxNLocator(4))
    ax.set_title("sink heads per image (rule: footnote)", fontsize=8)
    if total.any():
        # below the axis: inside, it would hide the bars of whichever rows sit under it
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=2, frameon=False)
    else:
        empty_note(ax, "no sink event in any variant", clear=False, size=8)


def _profile(ax: plt.Axes, table: list[dict[str, Any]], ys: list[float], n_rows: int) -> Any:
    """The strongest head's sink mass per block (mean over seeds) as a heatmap, row by row; returns the image."""
    n_blocks = max((len(t["profile"]) for t in table), default=0)
    grid = np.full((n_rows, max(n_blocks, 1)), np.nan)
    for t, y in zip(table, ys, strict=True):
        grid[int(y), :len(t["profile"])] = t["profile"]
    im = ax.imshow(grid, aspect="auto", cmap="magma", vmin=0, vmax=1, interpolation="nearest",
                   extent=(-0.5, grid.shape[1] - 0.5, n_rows - 0.5, -0.5))
    annotate_cells(ax, grid, most=120)
    ax.set_xticks(range(grid.shape[1]))
    ax.set_xlabel("block", fontsize=8)
    ax.set_title("strongest head's sink mass per block", fontsize=8)
    if not n_blocks:
        empty_note(ax, "no diagnostics summaries", size=8)
    where = ax.twinx()  # where each variant's strongest sink sits, beside its row
    where.set_ylim(n_rows - 0.5, -0.5)
    where.set_yticks(ys, [t["sink_at"] or "-" for t in table], fontsize=7)
    where.tick_params(length=0)
    where.set_ylabel("strongest sink at", fontsize=8)
    return im


def figure(table: list[dict[str, Any]], path: Path) -> Path:
    """The leaderboard's figure (see the module's docstring); the footnote says the marking and sink rules."""
    shown = [(c.key, c.label) for c in quality(table_columns(table))  # the Quality table's (W8A8's are no %)
             if c.table == "quality" and any(not math.isnan(t[c.key][0]) for t in table)]
    best, few = significant_best(table)
    labels, ys = rows_of([t["variant"] for t in table])
    split = {int(y) for y, t in zip(ys, table, strict=True) if t.get("differs")}  # named by what differs: long
    labels = [(y, textwrap.fill(name, LABEL_CHARS, break_on_hyphens=False) if y in split else name, head)
              for y, name, head in labels]
    n_rows = len(labels)
    lines = max(name.count("\n") + 1 for _, name, _ in labels)
    ratios = [1.1] * len(shown) + [1.5, 0.9, max(1.1, 0.6 + 0.25 * max((len(t["profile"]) for t in table),
                                                                        default=1))]
    notes = [f"Mean ± std over seeds. {mark_note(few, '*')}", *filter(None, [rows_note(table)]), *rule_notes(table)]
    fig_w = max(7.5, 2.6 + 1.2 * sum(ratios))
    note = "\n".join(textwrap.fill(n, int(fig_w * 18)) for n in notes)  # 18 characters of 7 pt text an inch
    # names of several lines (rows split by what differs): taller rows, and room for the footnote on top
    fig_h = 2.2 + ROW_IN * n_rows if lines == 1 else 1.6 + (LINE_IN * lines + 0.06) * n_rows + NOTE_IN * (
        note.count("\n") + 1)
    fig, axes = plt.subplots(1, len(ratios), figsize=(fig_w, fig_h), gridspec_kw={"width_ratios": ratios},
                             layout="constrained")
    for ax, (key, label) in zip(axes, shown, strict=False):
        _quality(ax, table, key, label, best.get(key), ys)
    _mechanism(axes[len(shown)], table, ys)
    massive = axes[len(shown) + 1]
    massive.plot([t["massive"][0] for t in table], ys, "D", ms=4, color="tab:red")
    massive.set_title("token norm: max / median", fontsize=8)
    im = _profile(axes[-1], table, ys, n_rows)
    bar = fig.colorbar(im, ax=axes[-1], location="bottom", shrink=0.9, aspect=12, pad=0.02)
    bar.set_label("mass", fontsize=7)
    bar.ax.tick_params(labelsize=7)
    for i, ax in enumerate(axes):
        ax.set_ylim(n_rows - 0.5, -0.5)
        ax.tick_params(labelsize=7)
        if ax is not axes[-1]:
            ax.grid(axis="x", color="#ddd", lw=0.5)
        if i:
            ax.set_yticks([])
    axes[0].set_yticks([y for y, _, _ in labels], [name for _, name, _ in labels], fontsize=8)
    for tick, (_, _, head) in zip(axes[0].get_yticklabels(), labels, strict=True):
        tick.set_fontweight("bold" if head else "normal")
    fig.supxlabel(note, fontsize=7, x=0.01, ha="left")
    fig.canvas.draw()  # lays the panels out: each title is wrapped to its panel's width
    for ax in axes:
        chars = int(ax.get_window_extent().width * 72 / fig.dpi / (8 * 0.55))
        ax.set_title("\n".join(textwrap.wrap(ax.get_title(), max(chars, 8))), fontsize=8)
    return save_figure(fig, path)
