"""PNG plots of one diagnosed checkpoint, and of sinks over training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.ticker import NullFormatter

from vitsinks.diagnostics.rules import BROADCAST_MAX_RANK, BROADCAST_MIN, NOP_MAX, SinkRules
from vitsinks.diagnostics.summary import CLASSES, LOCATIONS, layout_of, location
from vitsinks.utils.plotting import (
    CLASS_COLORS,
    CLASS_LABELS,
    annotate_cells,
    empty_note,
    index_ticks,
    location_style,
    log_axis,
    save_figure,
)


def rules_of(summary: dict[str, Any] | None, ratio: str = "ratio_out") -> SinkRules:
    """The rules a summary counted its sinks with (its `rule` record), else the defaults with `ratio`."""
    rule = (summary or {}).get("rule")
    return SinkRules.from_record(rule) if rule else SinkRules(ratio=ratio)


def rule_name(rules: SinkRules) -> str:
    """The event rule in a few words, for titles."""
    return "relaxed rule" if rules.rule == "relaxed" else f"Definition 1, eps {rules.eps:g}"


def _where(d: dict[str, np.ndarray], i: int, blk: int, h: int) -> str:
    """Where the dominant key of (image, block, head) sits: [CLS], register j, patch p or an extra key slot."""
    layout = layout_of(d)
    s = int(d["sink_idx"][i, blk, h])
    loc = int(location(d)[i, blk, h])
    if loc >= len(LOCATIONS):
        return f"{layout.locations[loc]} key"
    return ("[CLS]", f"register {s - layout.cls}", f"patch {s - layout.num_prefix}")[loc]


def attention_maps(d: dict[str, np.ndarray], images: np.ndarray, path: Path, rules: SinkRules | None = None,
                   top: int = 5, n_images: int = 3) -> Path:
    """The `top` heads that are sinks most often under `rules` on the first `n_images` images, on one colour scale."""
    rules = rules or SinkRules()
    maps = d["attn_col_mean"]  # (m, L, H, K): every key of the layout
    m = min(maps.shape[0], n_images, len(images))
    ev, cls = rules.events(d)[:m], rules.classify(d)[:m]
    mass = d["mass"][:m]
    score = ev.mean(0) * 10 + mass.mean(0)  # events first, then the mean mass
    heads = [np.unravel_index(f, score.shape) for f in np.argsort(score.reshape(-1), kind="stable")[::-1][:top]]
    layout, (gh, gw) = layout_of(d), d["grid"]
    patches, n_prefix = layout.patch_slice, layout.num_prefix
    heat = [[maps[i, b, h, patches].reshape(gh, gw) for b, h in heads] for i in range(m)]
    vmax = max(float(x.max()) for row in heat for x in row) or 1.0
    fig, axes = plt.subplots(m, len(heads) + 1, figsize=(1.9 * (len(heads) + 1) + 0.9, 2.15 * m + 0.7),
                             squeeze=False, layout="constrained")
    for i in range(m):
        axes[i, 0].imshow(images[i])
        axes[i, 0].set_ylabel(f"image {i}", fontsize=8)
        for col, (b, h) in enumerate(heads, start=1):
            ax = axes[i, col]
            im = ax.imshow(heat[i][col - 1], cmap="inferno", vmin=0, vmax=vmax)
            where, prefix = _where(d, i, b, h), float(maps[i, b, h, :n_prefix].sum())
            if ev[i, b, h]:
                name = CLASSES[int(cls[i, b, h])]
                ax.set_xlabel(f"sink on {where}: {CLASS_LABELS[name]}\nmass {mass[i, b, h]:.2f}, prefix {prefix:.2f}",
                              fontsize=7, color=CLASS_COLORS[name], fontweight="bold")
            else:
                ax.set_xlabel(f"no sink; top key {where}\nmass {mass[i, b, h]:.2f}, prefix {prefix:.2f}", fontsize=7)
            if i == 0:
                ax.set_title(f"block {b} head {h}", fontsize=8)
        for ax in axes[i]:
            ax.set(xticks=[], yticks=[])
    axes[0, 0].set_title("input", fontsize=8)
    fig.colorbar(im, ax=axes[:, 1:].ravel().tolist(), shrink=0.8, label="attention received per patch\n(mean over "
                 "queries)")
    n_events = int(ev.sum())
    what = (f"{n_events} sink events ({rule_name(rules)}) in these heads and images" if n_events else
            f"no sink event ({rule_name(rules)}) in these images: the heads with the most attention on one key, "
            f"none of them a sink")
    fig.suptitle(f"{what}\nmass: the share of attention on the top key; prefix: on [CLS] + registers", fontsize=9)
    return save_figure(fig, path)


def nop_broadcast_scatter(d: dict[str, np.ndarray], path: Path, rules: SinkRules | None = None) -> Path:
    """Value-norm ratio vs stable rank of every (image, block, head), sink events coloured by block, class bounds."""
    rules = rules or SinkRules()
    ev, ratio = rules.events(d), rules.ratio
    L = ev.shape[1]
    blocks = np.broadcast_to(np.arange(L)[None, :, None], ev.shape)
    fig, ax = plt.subplots(figsize=(6.4, 4.5))
    ax.scatter(d[ratio][~ev], d["stable_rank"][~ev], c="lightgray", s=6, label="no sink event")
    if ev.any():
        sc = ax.scatter(d[ratio][ev], d["stable_rank"][ev], c=blocks[ev], cmap="viridis", s=16, alpha=0.8,
                        vmin=0, vmax=L - 1, label="sink event")
        fig.colorbar(sc, ax=ax, label="block of the sink event")
    ax.axvline(NOP_MAX, color=CLASS_COLORS["nop"], ls="--", lw=1, label=f"NOP-like: <= {NOP_MAX:g}")
    ax.axvline(BROADCAST_MIN, color=CLASS_COLORS["broadcast"], ls="--", lw=1,
               label=f"broadcast-like: >= {BROADCAST_MIN:g}" + (f", rank <= {BROADCAST_MAX_RANK:g}"
                                                                if rules.use_stable_rank else ""))
    if rules.use_stable_rank:
        ax.axhline(BROADCAST_MAX_RANK, color=CLASS_COLORS["broadcast"], ls=":", lw=1)
    log_axis(ax, [*d[ratio].reshape(-1).tolist(), NOP_MAX, BROADCAST_MIN], which="x")
    ax.set(xlabel=f"{ratio} (dominant key's value norm / mean of the others, log)",
           ylabel="stable rank of the head update")
    n = int(ev.sum())
    ax.set_title(f"{n} sink events ({rule_name(rules)})" if n else
                 f"no sink event ({rule_name(rules)}): every (image, block, head) is grey", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, path)


def sink_heatmap(d: dict[str, np.ndarray], path: Path, rules: SinkRules | None = None) -> Path:
    """Per (block, head): the share of images on which it is a sink under `rules`, and its mean mass."""
    rules = rules or SinkRules()
    freq, mass = rules.events(d).mean(axis=0), d["mass"].mean(axis=0)
    L, H = freq.shape
    fig, axes = plt.subplots(1, 2, figsize=(2 * max(4.0, 1.8 + 0.35 * H), max(3.0, 1.2 + 0.3 * L)))
    for ax, vals, label, title in ((axes[0], freq, "share of images", f"sink frequency ({rule_name(rules)})"),
                                   (axes[1], mass, "mean mass over images", "mass: attention on the top key")):
        ax.set_title(title, fontsize=9)
        if ax is axes[0] and not freq.any():
            empty_note(ax, f"no sink event ({rule_name(rules)}) in any block or head on these {len(d['mass'])} "
                           f"images")
            continue
        im = ax.imshow(vals, vmin=0, vmax=1, cmap="magma", aspect="auto")
        annotate_cells(ax, vals)
        fig.colorbar(im, ax=ax, label=label)
        ax.set(xticks=range(H), yticks=range(L), xlabel="head", ylabel="block")
    return save_figure(fig, path)


def location_by_block(summary: dict[str, Any], path: Path) -> Path:
    """Sinks per image in each block, stacked by location and split by NOP / broadcast class."""
    loc, cls = summary["location_by_block"], summary["class_by_block"]
    L = len(loc["cls"])
    x = np.arange(L)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    rules = rules_of(summary)
    loc_colours, loc_labels = location_style(list(loc))
    for ax, groups, colors, labels, names, title in (
            (axes[0], loc, loc_colours, loc_labels, list(loc), "where the sink sits"),
            (axes[1], cls, CLASS_COLORS, CLASS_LABELS, CLASSES, "what the sink does")):
        bottom = np.zeros(L)
        for name in names:
            ax.bar(x, groups[name], bottom=bottom, color=colors[name], label=labels[name])
            bottom += np.array(groups[name])
        ax.set(xlabel="block", xticks=x)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0, top=max(1.0, float(bottom.max()) * 1.1))
        if bottom.any():
            ax.legend(fontsize=7)
        else:
            empty_note(ax, f"no sink event ({rule_name(rules)}) in any block", clear=False)
    axes[0].set_ylabel("sink heads per image")
    return save_figure(fig, path)


def massive_activations(d: dict[str, np.ndarray], path: Path) -> Path:
    """Per block: max / median residual token norm (median over images, 10-90% band) and the largest norm."""
    ratio = d["massive_ratio"]
    L = ratio.shape[1]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(range(L), np.median(ratio, 0), "o-", label="max / median token norm")
    ax.fill_between(range(L), np.percentile(ratio, 10, 0), np.percentile(ratio, 90, 0), alpha=0.25)
    ax2 = ax.twinx()
    ax2.plot(range(L), np.median(d["token_norm_max"], 0), "s--", color="tab:red", label="max token norm")
    ax2.set_ylabel("max token norm", color="tab:red")
    ax.set(xlabel="block (output residual stream)", ylabel="max / median")
    ax.set_title("massive activations", fontsize=9)
    ax.legend(loc="upper left", fontsize=7)
    return save_figure(fig, path)


QUANTILE_MARKERS = {"q50": "o", "q90": "^", "q99": "s", "max": "x"}


def residual_norms(summary: dict[str, Any], path: Path) -> Path:
    """Per block, the token-norm histogram (log colours) with its quantiles marked, and the quantiles vs block."""
    r = summary["residual"]
    edges = np.array(r["norm_hist"]["edges"])
    counts = np.array(r["norm_hist"]["counts_by_block"], dtype=float)
    share = np.ma.masked_equal(counts / np.maximum(counts.sum(axis=1, keepdims=True), 1), 0)
    L = len(counts)
    fig, axes = plt.subplots(1, 2, figsize=(11, max(3.6, 1.5 + 0.25 * L)))
    axes[0].set_facecolor("black")  # empty bins
    lo = float(share.min()) if share.count() else 1.0
    mesh = axes[0].pcolormesh(edges, np.arange(L + 1) - 0.5, share, cmap="magma", shading="flat",
                              norm=LogNorm(vmin=min(lo, 0.999) / 4, vmax=1))  # the rarest bin shows
    fig.colorbar(mesh, ax=axes[0], label="share of the block's tokens (log)")
    qs = r["norm_quantiles_by_block"]
    for name, marker in QUANTILE_MARKERS.items():
        axes[0].plot(qs[name], range(L), ls="none", marker=marker, mfc="none", mec="tab:cyan", label=name)
        axes[1].plot(range(L), qs[name], marker=marker, label=name)
    axes[0].set_xscale("log")
    axes[0].xaxis.set_minor_formatter(NullFormatter())  # the minor labels of a short log axis overlap
    axes[0].set(yticks=range(L), xlabel="token norm ||h|| (log)", ylabel="block (output residual stream)")
    axes[0].set_title("token-norm histogram per block", fontsize=9)
    axes[0].legend(fontsize=7, loc="upper left")
    log_axis(axes[1], [v for vals in qs.values() for v in vals])
    axes[1].set(xticks=range(L), xlabel="block", ylabel="token norm (over images x tokens)")
    axes[1].set_title("token-norm quantiles per block", fontsize=9)
    axes[1].legend(fontsize=7)
    return save_figure(fig, path)


def high_norm_tokens(summary: dict[str, Any], path: Path) -> Path:
    """Per block: high-norm tokens per image at each k, the share entering it that are its sinks, top |h| / median."""
    r = summary["residual"]
    high, top = r["high_norm"], r["top_activations"]
    L = len(top["ratio_by_block"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for k, h in high.items():
        axes[0].plot(range(L), h["per_image_by_block"], "o-", label=f"k = {float(k):g}")
        share = [np.nan if x is None else x for x in h["sink_share_by_block"]]
        axes[1].plot(range(L), share, "o-", label=f"k = {float(k):g}")
    most = max((max(h["per_image_by_block"]) for h in high.values()), default=0.0)
    shared = any(x is not None for h in high.values() for x in h["sink_share_by_block"])
    axes[0].set_ylim(bottom=0, top=max(1.0, most * 1.1))
    axes[0].set_ylabel("high-norm tokens per image")
    axes[0].set_title("tokens with norm > k x the median", fontsize=9)
    axes[1].set_ylim(-0.05, 1.05)
    if not shared:
        axes[1].text(0.5, 0.5, "no high-norm token enters a block", ha="center", transform=axes[1].transAxes)
    axes[1].set_ylabel("share that are sinks of the block")
    axes[1].set_title("high-norm tokens entering the block that are its sinks", fontsize=9)
    ratio = [np.inf if x is None else x for x in top["ratio_by_block"]]
    axes[2].plot(range(L), ratio, "s-", color="tab:red")
    for b, (x, loc, ch) in enumerate(zip(ratio, top["location_by_block"], top["channel_by_block"], strict=True)):
        axes[2].annotate(f"{loc} c{ch}", (b, x), fontsize=6, xytext=(2, 3), textcoords="offset points")
    log_axis(axes[2], [x for x in ratio if np.isfinite(x)])
    axes[2].set_ylabel("top-1 |h| / median |h|")
    axes[2].set_title("largest activation (its token's location, channel)", fontsize=9)
    for ax, x in zip(axes, ("block (its output)", "block (the tokens entering it)", "block (its output)"),
                     strict=True):
        ax.set(xlabel=x, xticks=range(L))
    for ax in axes[:2]:
        if high:
            ax.legend(fontsize=7)
    return save_figure(fig, path)


def over_training(steps: list[int], summaries: list[dict[str, Any]], path: Path) -> Path:
    """Sinks per image by class, sink frequency and the strongest head's mass per block, all vs step."""
    rules = rules_of(summaries[-1] if summaries else None)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    none = f"no sink event ({rule_name(rules)}) at any of the {len(steps)} checkpoints"
    for name in CLASSES:
        axes[0].plot(steps, [s["sinks_per_image"][name]["all"] for s in summaries], "o-",
                     color=CLASS_COLORS[name], label=CLASS_LABELS[name])
    axes[0].plot(steps, [s["sinks_per_image_block0"]["all"]["all"] for s in summaries], ":",
                 color=CLASS_COLORS["all"], label="block 0 (all)")
    most = max([s["sinks_per_image"]["all"]["all"] for s in summaries]
               + [s["sinks_per_image_block0"]["all"]["all"] for s in summaries])
    axes[0].set_ylim(bottom=0, top=max(1.0, most * 1.1))
    axes[0].set(xlabel="step", ylabel="sinks per image (blocks 1..L-1)")
    if most:
        axes[0].legend(fontsize=7)
    else:
        empty_note(axes[0], none, clear=False)
    axes[0].set_title("sinks per image by class", fontsize=9)
    for ax, key, label, title in ((axes[1], "block_frequency", "fraction of heads x images", "sink frequency"),
                                  (axes[2], "max_mass_by_block", "mean over images", "strongest head's mass")):
        ax.set_title(f"{title} per block over training", fontsize=9)
        grid = np.array([s.get(key, [np.nan] * len(s["block_frequency"])) for s in summaries]).T  # (L, ckpts)
        if key == "block_frequency" and not np.nan_to_num(grid).any():
            empty_note(ax, none)
            continue
        im = ax.imshow(grid, aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=1,  # both are fractions
                       extent=(-0.5, len(steps) - 0.5, -0.5, grid.shape[0] - 0.5))
        annotate_cells(ax, grid)
        index_ticks(ax, [str(s) for s in steps])
        ax.set(yticks=range(grid.shape[0]), xlabel="checkpoint step", ylabel="block")
        fig.colorbar(im, ax=ax, label=label)
    return save_figure(fig, path)


def all_plots(d: dict[str, np.ndarray], summary: dict[str, Any], images: np.ndarray, out: Path,
              ratio: str = "ratio_out") -> list[Path]:
    """Every per-checkpoint plot into `out`, counted with the summary's rule (else the defaults with `ratio`)."""
    rules = rules_of(summary, ratio)
    return [
        attention_maps(d, images, out / "attention_maps.png", rules),
        nop_broadcast_scatter(d, out / "nop_broadcast_scatter.png", rules),
        sink_heatmap(d, out / "sink_heatmap.png", rules),
        location_by_block(summary, out / "sink_location_by_block.png"),
        massive_activations(d, out / "massive_activations.png"),
        *((residual_norms(summary, out / "residual_norms.png"), high_norm_tokens(summary, out / "high_norm_tokens.png"))
          if summary.get("residual") else ()),
    ]


__all__ = ["all_plots", "over_training"]
