"""PNG plots of one diagnosed checkpoint, and of sinks over training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

from vitsinks.utils.plotting import log_axis, save_figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from vitsinks.diagnostics.summary import CLASSES, LOCATIONS, events, location  # noqa: E402

LOC_COLORS = {"cls": "tab:red", "register": "tab:purple", "patch": "tab:blue"}
CLASS_COLORS = {"nop": "tab:gray", "broadcast": "tab:orange", "unclassified": "tab:green"}


def attention_maps(d: dict[str, np.ndarray], images: np.ndarray, path: Path, top: int = 6) -> Path:
    """The strongest sink heads (highest mass) of the first images: the image, and the mean attention each patch
    receives over it; the title gives the sink token and the mass on the prefix tokens."""
    maps = d["attn_col_mean"]  # (m, L, H, N)
    m = maps.shape[0]
    mass = d["mass"][:m]
    order = np.argsort(mass.reshape(-1))[::-1][:top]
    n_prefix, (gh, gw) = int(d["num_prefix"]), d["grid"]
    loc_names = {0: "[CLS]", 1: "register"}
    fig, axes = plt.subplots(2, top, figsize=(2.2 * top, 4.6))
    axes = np.asarray(axes).reshape(2, top)
    for col, flat in enumerate(order):
        i, blk, h = np.unravel_index(flat, mass.shape)
        s = int(d["sink_idx"][i, blk, h])
        where = loc_names.get(int(location(d)[i, blk, h]), f"patch {s - n_prefix}")
        axes[0, col].imshow(images[i])
        axes[0, col].set_title(f"img {i}", fontsize=8)
        heat = maps[i, blk, h, n_prefix:].reshape(gh, gw)
        axes[1, col].imshow(images[i])
        axes[1, col].imshow(heat, cmap="inferno", alpha=0.75, extent=(0, images.shape[2], images.shape[1], 0))
        axes[1, col].set_title(f"b{blk} h{h}: sink {where}\nmass {mass[i, blk, h]:.2f}, prefix "
                               f"{maps[i, blk, h, :n_prefix].sum():.2f}", fontsize=7)
        for ax in axes[:, col]:
            ax.set_xticks([])
            ax.set_yticks([])
    n_events = int(events(d)[:m].sum())
    fig.suptitle(f"heads with the most attention on one token (mass), mean attention received per patch; "
                 f"{n_events} sink events (relaxed rule) in these images", fontsize=9)
    return save_figure(fig, path)


def nop_broadcast_scatter(d: dict[str, np.ndarray], path: Path, ratio: str = "ratio_out") -> Path:
    """Value-norm ratio vs stable rank of every (image, block, head): sink events coloured by block, the other
    heads in grey, with the class boundaries."""
    ev = events(d)
    L = ev.shape[1]
    blocks = np.broadcast_to(np.arange(L)[None, :, None], ev.shape)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter(d[ratio][~ev], d["stable_rank"][~ev], c="lightgray", s=6, label="no sink event")
    if ev.any():
        sc = ax.scatter(d[ratio][ev], d["stable_rank"][ev], c=blocks[ev], cmap="viridis", s=16, alpha=0.8,
                        vmin=0, vmax=L - 1, label="sink event")
        fig.colorbar(sc, ax=ax, label="block")
    ax.axvline(0.2, color="gray", ls="--", lw=1)
    ax.axvline(0.5, color="tab:orange", ls="--", lw=1)
    ax.axhline(1.5, color="tab:orange", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel(f"{ratio} (dominant key's value norm / mean of the others)")
    ax.set_ylabel("stable rank of the head update")
    ax.set_title(f"{int(ev.sum())} sink events: NOP-like left of 0.2, broadcast-like right of 0.5 with rank <= 1.5",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    return save_figure(fig, path)


def sink_heatmap(d: dict[str, np.ndarray], path: Path) -> Path:
    """Fraction of images on which each (block, head) is a sink."""
    freq = events(d).mean(axis=0)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.5 + 0.35 * freq.shape[1]), max(3.0, 1 + 0.3 * freq.shape[0])))
    im = ax.imshow(freq, vmin=0, vmax=1, cmap="magma", aspect="auto")
    fig.colorbar(im, ax=ax, label="sink frequency over images")
    ax.set_xticks(range(freq.shape[1]))
    ax.set_yticks(range(freq.shape[0]))
    ax.set_xlabel("head")
    ax.set_ylabel("block")
    ax.set_title("sink frequency (relaxed rule)", fontsize=9)
    return save_figure(fig, path)


def location_by_block(summary: dict[str, Any], path: Path) -> Path:
    """Sinks per image in each block, stacked by location and split by NOP / broadcast class."""
    loc = summary["location_by_block"]
    cls = summary["class_by_block"]
    L = len(loc["cls"])
    x = np.arange(L)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, groups, colors, title in ((axes[0], loc, LOC_COLORS, "where the sink sits"),
                                      (axes[1], cls, CLASS_COLORS, "what the sink does")):
        bottom = np.zeros(L)
        for name in (LOCATIONS if groups is loc else CLASSES):
            ax.bar(x, groups[name], bottom=bottom, color=colors[name], label=name)
            bottom += np.array(groups[name])
        ax.set_xlabel("block")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0, top=max(1.0, float(bottom.max()) * 1.1))
        ax.legend(fontsize=7)
        if not bottom.any():
            ax.text(0.5, 0.5, "no sink events (relaxed rule)", ha="center", transform=ax.transAxes)
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
    ax.set_xlabel("block (output residual stream)")
    ax.set_ylabel("max / median")
    ax.set_title("massive activations", fontsize=9)
    ax.legend(loc="upper left", fontsize=7)
    return save_figure(fig, path)


QUANTILE_MARKERS = {"q50": "o", "q90": "^", "q99": "s", "max": "x"}


def residual_norms(summary: dict[str, Any], path: Path) -> Path:
    """Per block, the distribution of the residual token norms (share of the tokens in each log-spaced bin, over
    images x tokens, on a log colour scale so that a few high-norm tokens show) with its quantiles marked on it,
    and the quantiles against the block."""
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
    axes[0].set_yticks(range(L))
    axes[0].set_xlabel("token norm ||h|| (log)")
    axes[0].set_ylabel("block (output residual stream)")
    axes[0].set_title("token-norm histogram per block", fontsize=9)
    axes[0].legend(fontsize=7, loc="upper left")
    log_axis(axes[1], [v for vals in qs.values() for v in vals])
    axes[1].set_xticks(range(L))
    axes[1].set_xlabel("block")
    axes[1].set_ylabel("token norm (over images x tokens)")
    axes[1].set_title("token-norm quantiles per block", fontsize=9)
    axes[1].legend(fontsize=7)
    return save_figure(fig, path)


def high_norm_tokens(summary: dict[str, Any], path: Path) -> Path:
    """Per block: high-norm tokens per image at each threshold k (norm > k x the image's median) at its output, the
    share of those entering it that are its attention sinks, and the largest activation / median |h|."""
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
        ax.set_xlabel(x)
        ax.set_xticks(range(L))
    for ax in axes[:2]:
        if high:
            ax.legend(fontsize=7)
    return save_figure(fig, path)


def over_training(steps: list[int], summaries: list[dict[str, Any]], path: Path) -> Path:
    """Sinks per image by class vs step, the blocks where sinks sit vs step (emergence stages), and the mass of
    each block's strongest head vs step (how concentrated attention gets, also before any event)."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for name in CLASSES:
        axes[0].plot(steps, [s["sinks_per_image"][name]["all"] for s in summaries], "o-",
                     color=CLASS_COLORS[name], label=name)
    axes[0].plot(steps, [s["sinks_per_image_block0"]["all"]["all"] for s in summaries], "k:", label="block 0 (all)")
    axes[0].set_ylim(bottom=0, top=max(1.0, max(s["sinks_per_image"]["all"]["all"] for s in summaries) * 1.1))
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("sinks per image (blocks 1..L-1)")
    axes[0].legend(fontsize=7)
    axes[0].set_title("sinks per image by class", fontsize=9)
    for ax, key, label, title in ((axes[1], "block_frequency", "fraction of heads x images", "sink frequency"),
                                  (axes[2], "max_mass_by_block", "mean over images", "strongest head's mass")):
        grid = np.array([s.get(key, [np.nan] * len(s["block_frequency"])) for s in summaries]).T  # (L, ckpts)
        im = ax.imshow(grid, aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=1,  # both are fractions
                       extent=(-0.5, len(steps) - 0.5, -0.5, grid.shape[0] - 0.5))
        ax.set_xticks(range(len(steps)), [str(s) for s in steps], rotation=45, fontsize=7)
        ax.set_yticks(range(grid.shape[0]))
        ax.set_xlabel("checkpoint step")
        ax.set_ylabel("block")
        ax.set_title(f"{title} per block over training", fontsize=9)
        fig.colorbar(im, ax=ax, label=label)
    return save_figure(fig, path)


def all_plots(d: dict[str, np.ndarray], summary: dict[str, Any], images: np.ndarray, out: Path,
              ratio: str = "ratio_out") -> list[Path]:
    """Every per-checkpoint plot into `out`."""
    return [
        attention_maps(d, images, out / "attention_maps.png"),
        nop_broadcast_scatter(d, out / "nop_broadcast_scatter.png", ratio),
        sink_heatmap(d, out / "sink_heatmap.png"),
        location_by_block(summary, out / "sink_location_by_block.png"),
        massive_activations(d, out / "massive_activations.png"),
        *((residual_norms(summary, out / "residual_norms.png"), high_norm_tokens(summary, out / "high_norm_tokens.png"))
          if summary.get("residual") else ()),
    ]


__all__ = ["all_plots", "over_training"]
