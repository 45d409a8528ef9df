"""The leaderboard's figure: quality bars with the Welch marks, sinks per image by class, and each variant's
strongest-head sink mass per block."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from vitsinks.report.collect import quality
from vitsinks.report.render import mark_note, rule_notes, significant_best, table_columns
from vitsinks.utils.plotting import save_figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def figure(table: list[dict[str, Any]], path: Path) -> Path:
    """Quality bars (one group per quality metric, `*` over a variant marked by Welch's test), sinks per image split
    by class, and the per-block profile of each variant's strongest-head sink mass side by side (never empty: it
    moves before any sink event); the footnote says the marking and sink rules."""
    shown = [(c.key, c.label) for c in quality(table_columns(table))  # the Quality table's (W8A8's are no %)
             if c.table == "quality" and any(not math.isnan(t[c.key][0]) for t in table)]
    best, few = significant_best(table)
    variants = [t["variant"] for t in table]
    x = np.arange(len(variants))
    fig, axes = plt.subplots(1, 3, figsize=(21, 4.8), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    width = 0.8 / max(len(shown), 1)
    for i, (k, n) in enumerate(shown):
        means = [t[k][0] for t in table]
        errs = [0 if math.isnan(t[k][1]) else t[k][1] for t in table]
        axes[0].bar(x + i * width, means, width, yerr=errs, label=n, capsize=2)
        for j, t in enumerate(table):
            if best.get(k) == t["variant"]:
                axes[0].text(x[j] + i * width, means[j] + errs[j], "*", ha="center", va="bottom", fontsize=12)
    axes[0].set_xticks(x + width * (len(shown) - 1) / 2, variants, rotation=30, ha="right", fontsize=8)
    tops = [t[k][0] + (0 if math.isnan(t[k][1]) else t[k][1]) for k, _ in shown for t in table]
    top = max([v for v in tops if not math.isnan(v)], default=1.0)
    axes[0].set_ylim(top=max(top, 1.0) * 1.4)  # a band above the bars for the marks and the legend
    axes[0].set_ylabel("%")
    axes[0].set_title("quality", fontsize=10)
    axes[0].legend(fontsize=7, loc="upper center", ncol=2)
    bottom = np.zeros(len(variants))
    for key, name, color in (("nop", "NOP-like", "tab:gray"), ("broadcast", "broadcast-like", "tab:orange")):
        vals = np.nan_to_num([t[key][0] for t in table])
        axes[1].bar(x, vals, bottom=bottom, color=color, label=name)
        bottom += vals
    total = np.nan_to_num([t["sinks"][0] for t in table])
    axes[1].bar(x, total - bottom, bottom=bottom, color="tab:green", label="unclassified")
    axes[1].set_xticks(x, variants, rotation=30, ha="right", fontsize=8)
    axes[1].set_ylim(0, max(1.0, float(total.max()) * 1.15))
    axes[1].set_ylabel("sink heads per image (rule: footnote)")
    axes[1].set_title("mechanism", fontsize=10)
    if not total.any():
        axes[1].text(0.5, 0.3, "no sink events", ha="center", transform=axes[1].transAxes)  # below the diamonds
    massive = axes[1].twinx()
    massive.plot(x, [t["massive"][0] for t in table], "D", color="tab:red", label="max / median token norm")
    massive.set_ylim(0, np.nanmax([t["massive"][0] for t in table] + [1.0]) * 1.6)
    massive.set_ylabel("max / median token norm", color="tab:red")
    handles = axes[1].get_legend_handles_labels()
    extra = massive.get_legend_handles_labels()
    axes[1].legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7, loc="upper right")
    _profiles(axes[2], table)
    notes = [f"Mean ± std over seeds. {mark_note(few, '*')}", *rule_notes(table)]
    fig.supxlabel("\n".join(textwrap.fill(n, 260) for n in notes), fontsize=7, x=0.005, ha="left")
    return save_figure(fig, path)


def _profiles(ax: plt.Axes, table: list[dict[str, Any]]) -> None:
    """Grouped bars: per block, each variant's strongest-head sink mass (mean over seeds), labelled with where
    that variant's strongest sink sits."""
    rows = [t for t in table if t["profile"]]
    if not rows:
        ax.text(0.5, 0.5, "no diagnostics summaries", ha="center", transform=ax.transAxes)
        return
    n_blocks = max(len(t["profile"]) for t in rows)
    width = 0.85 / len(rows)
    colors = plt.get_cmap("tab10" if len(rows) <= 10 else "tab20")
    for i, t in enumerate(rows):
        prof = np.array(t["profile"])
        ax.bar(np.arange(len(prof)) + i * width, prof, width, color=colors(i % colors.N),
               label=f"{t['variant']} ({t['sink_at']})")
    ax.axhline(0.5, color="gray", ls=":", lw=1)
    ax.set_xticks(np.arange(n_blocks) + width * (len(rows) - 1) / 2, [str(b) for b in range(n_blocks)])
    ax.set_xlabel("block")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("strongest head's sink mass (mean over images)")
    ax.set_title("mechanism per block: strongest head's sink mass (legend: where it sits)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
