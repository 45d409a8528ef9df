"""The look of the report pages (`vitsinks.diagnostics.page`): how numbers are written (`num`), the page chrome (CSS,
sections, tables, colour bars), and the pictures (maps over the patch grid, PCA colours, matplotlib figures) as
inline PNG data URIs."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from PIL import Image

from vitsinks.utils.errors import NonFinite
from vitsinks.utils.plotting import (
    CLASS_COLORS,
    CLASS_LABELS,
    EXTRA_KEY_COLORS,
    LOCATION_COLORS,
    annotate_cells,
    empty_note,
    index_ticks,
    log_axis,
)

ATTN_CMAP, NORM_CMAP = "inferno", "viridis"
MIN_SIDE = 128  # pictures smaller than this are enlarged by a whole factor, nearest-neighbour


CSS = """body{font-family:system-ui,sans-serif;font-size:14px;margin:0 auto;padding:0 1em 2em;max-width:1340px;
color:#222}
h1{font-size:1.45em;margin:.6em 0 .1em} h2{font-size:1.15em;margin:0 0 .4em} h3{font-size:.95em;margin:.8em 0 .3em}
nav{position:sticky;top:0;background:#fff;padding:.3em 0;border-bottom:1px solid #ddd;z-index:1}
nav a{margin-right:1.2em} section{margin:1em 0 1.6em} .meta{color:#555;margin:.2em 0 .4em}
.note{color:#666;font-size:.9em} .row{display:flex;flex-wrap:wrap;gap:2em;align-items:flex-start}
table{border-collapse:collapse;margin-bottom:1em;font-size:.88em} th{background:#eee}
td,th{border:1px solid #bbb;padding:2px 7px;text-align:right} td:first-child,th:first-child{text-align:left}
.card{border:1px solid #ddd;border-radius:6px;padding:.3em .6em .6em;margin:.8em 0}
.maps{display:grid;gap:4px 6px;align-items:start}
.colhead{font-weight:600;font-size:.85em;text-align:center} .rowhead{font-size:.8em;color:#444;align-self:center}
.tile{font-size:11px;line-height:1.2;text-align:center;width:100%;max-width:150px;overflow-wrap:anywhere;margin:0 auto}
.cap.hot{color:#c00;font-weight:600} .scale{font-size:.85em;color:#444;margin:0 0 .3em}
img.map{width:100%;max-width:150px;image-rendering:pixelated;display:block;margin:1px auto}
.bar{display:flex;height:7px;margin:2px 0;border:1px solid #999} .bar span{display:block;height:100%}
.sw{display:inline-block;width:.9em;height:.7em;vertical-align:middle}
.legend{font-size:.85em;margin:.25em 0;display:flex;align-items:center;gap:.5em}
.cbar{display:inline-flex;align-items:center;gap:.3em;font-size:.9em;white-space:nowrap}
.cbar i{display:inline-block;width:110px;height:10px;border:1px solid #999}
img.fig{max-width:min(100%,900px);display:block;margin:.4em 0} img.fig.full{max-width:100%}
.wide{grid-column:span 4;align-self:center} #register-neurons td:nth-child(2){text-align:left}
.swatches{font-size:.85em} .swatch{margin-right:1em}
""" + (f".cls{{background:{LOCATION_COLORS['cls']}}} .reg{{background:{LOCATION_COLORS['register']};border-left:1px "
       f"solid #fff}} .patch{{background:{LOCATION_COLORS['patch']}}} .extra{{background:{EXTRA_KEY_COLORS[0]};"
       f"border-left:1px solid #fff}}")  # one colour per location: the PNGs' too


def page(title: str, meta: str, body: str, links: list[tuple[str, str]]) -> str:
    """A whole report page: `title`, a line of `meta`, a bar of links to its sections, then `body`."""
    nav = "".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t in links)
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head>\n<body><h1>{html.escape(title)}</h1><p class=\"meta\">{meta}</p>"
            f"{f'<nav>{nav}</nav>' if nav else ''}\n{body}\n</body></html>\n")


def panel(anchor: str, title: str, body: str) -> str:
    """One section of a page."""
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>\n{body}</section>\n'


def cbar(gradient: str, lo: str, hi: str) -> str:
    """A small colour bar: `lo`, the gradient, `hi`."""
    return f'<span class="cbar">{html.escape(lo)}<i style="background:{gradient}"></i>{html.escape(hi)}</span>'


def num(x: Any) -> str:
    """How every number is written on the pages: integers as they are, floats with 3 significant digits
    (whole numbers from 1000 up), `-` for None / NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, bool | int | np.integer):
        return str(int(x))
    x = float(x)
    if abs(x) >= 1000:
        return f"{x:.0f}"
    return f"{x:.3g}" if x == 0 or abs(x) >= 1e-3 else f"{x:.2e}"


def scale_factor(side: int) -> int:
    """The whole factor that brings an image side up to at least MIN_SIDE pixels (1 when it already is)."""
    return max(1, -(-MIN_SIDE // max(side, 1)))


def upscale(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A (h, w, ...) array resized to `size` (H, W) nearest-neighbour: every cell becomes a flat block."""
    h, w = rgb.shape[:2]
    rows, cols = np.arange(size[0]) * h // size[0], np.arange(size[1]) * w // size[1]
    return rgb[rows][:, cols]


def colour(values: np.ndarray, vmin: float, vmax: float, cmap: str) -> np.ndarray:
    """uint8 RGB of `values` through `cmap` on [vmin, vmax] (a flat map, vmin == vmax, is the colour of 0)."""
    span = vmax - vmin
    t = np.clip((values - vmin) / span, 0, 1) if span > 0 else np.zeros_like(values, dtype=float)
    return (matplotlib.colormaps[cmap](t)[..., :3] * 255).round().astype(np.uint8)


def grid_picture(values: np.ndarray, vmin: float, vmax: float, cmap: str, size: tuple[int, int]) -> np.ndarray:
    """A (gh, gw) map coloured by `cmap` on [vmin, vmax] and upscaled nearest-neighbour to `size`."""
    return upscale(colour(values, vmin, vmax, cmap), size)


def png_uri(rgb: np.ndarray) -> str:
    """A uint8 RGB array as a `data:image/png;base64,...` URI."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8)).save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def figure_uri(fig: plt.Figure) -> str:
    """A matplotlib figure (laid out, 110 dpi, then closed) as a PNG data URI."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def gradient_css(cmap: str, stops: int = 9) -> str:
    """A CSS linear-gradient running through `cmap` from its low end (left) to its high end (right)."""
    cols = colour(np.linspace(0, 1, stops), 0.0, 1.0, cmap)
    return "linear-gradient(to right, " + ", ".join(f"rgb({r},{g},{b})" for r, g, b in cols) + ")"


def pca_colours(feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first three principal components of patch features (n, P, D), fitted over all patches, min-max scaled to
    colours in [0, 1] (n, P, 3), and their shares of the variance (3,); each sign fixed so that the largest loading
    is positive (ties: the lowest channel), which makes the colours a function of the features alone."""
    n, p, dim = feats.shape
    x = feats.reshape(n * p, dim).astype(np.float64)
    if not np.isfinite(x).all():
        raise NonFinite("the final patch features are not finite (NaN or inf): the checkpoint is broken; report a "
                        "checkpoint of a run that did not diverge")
    x = x - x.mean(0)
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    k = min(3, len(s))
    vt = vt[:k] * np.sign(vt[:k][np.arange(k), np.abs(vt[:k]).argmax(1)])[:, None]
    proj = x @ vt.T  # (n * p, k)
    lo, hi = proj.min(0), proj.max(0)
    span = np.where(hi - lo > 1e-12 * max(1.0, float(np.abs(proj).max(initial=0))), hi - lo, np.inf)
    rgb = np.full((n * p, 3), 0.5)  # a component without variance (or missing) shows as mid-grey
    rgb[:, :k] = np.where(np.isfinite(span), (proj - lo) / span, 0.5)
    total = float((s ** 2).sum())
    evr = np.zeros(3)
    evr[:k] = (s[:k] ** 2) / total if total > 0 else 0.0
    return rgb.reshape(n, p, 3), evr


def residual_figure(quantiles: dict[str, list[float]] | None, ratio: list[float] | None) -> str:
    """Per block: the token-norm quantiles (log scale) and the top activation ratio (max / median |activation|)."""
    panels = [q for q in (quantiles, ratio) if q]
    fig, grid = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 3.2), squeeze=False)
    axes = list(grid[0])
    if quantiles:
        ax = axes.pop(0)
        for name, vals in quantiles.items():
            ax.plot(range(len(vals)), vals, "o-", ms=3, label=name)
        log_axis(ax, [v for vals in quantiles.values() for v in vals])
        ax.set(xlabel="block (output residual stream)", ylabel="token L2 norm",
               xticks=range(len(next(iter(quantiles.values())))))
        ax.set_title("token-norm quantiles over tokens x images", fontsize=9)
        ax.legend(fontsize=7)
    if ratio:
        ax = axes.pop(0)
        ax.plot(range(len(ratio)), ratio, "s-", color="tab:red", ms=3)
        ax.set(xlabel="block", ylabel="top |activation| / median", xticks=range(len(ratio)))
        ax.set_title("top activation ratio", fontsize=9)
    return figure_uri(fig)


def over_training_figure(steps: Sequence[int], spi: dict[str, list[float]], mass: np.ndarray,
                         residual: dict[str, Any]) -> str:
    """Sinks per image by class, the strongest head's mass per block and the residual measures, vs step."""
    n = 2 + bool(residual)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.4))
    x = np.arange(len(steps))
    labels = [str(s) for s in steps]
    for name, vals in spi.items():
        axes[0].plot(x, vals, "o-", ms=3, label=CLASS_LABELS[name], color=CLASS_COLORS[name])
    index_ticks(axes[0], labels)
    axes[0].set(xlabel="checkpoint step", ylabel="sink heads per image (blocks 1..L-1)")
    most = max((v for vals in spi.values() for v in vals), default=0.0)
    axes[0].set_ylim(0, max(1.0, 1.1 * most))
    axes[0].set_title("sinks per image by class", fontsize=9)
    if most:
        axes[0].legend(fontsize=7)
    else:
        empty_note(axes[0], f"no sink event at any of the {len(steps)} checkpoints", clear=False)
    im = axes[1].imshow(mass, aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=1,
                        extent=(-0.5, len(steps) - 0.5, -0.5, mass.shape[0] - 0.5))
    annotate_cells(axes[1], mass)
    index_ticks(axes[1], labels)
    axes[1].set(yticks=range(mass.shape[0]), xlabel="checkpoint step", ylabel="block")
    axes[1].set_title("strongest head's sink mass per block", fontsize=9)
    fig.colorbar(im, ax=axes[1], label="mean mass over images")
    if residual:
        ax = axes[2]
        for (label, vals), style in zip(residual.items(), ("o-", "s--", "^:"), strict=False):
            ax.plot(x, [np.nan if v is None else v for v in vals], style, ms=3, label=label)
        log_axis(ax, [v for vals in residual.values() for v in vals if v is not None])
        index_ticks(ax, labels)
        ax.set(xlabel="checkpoint step", ylabel="max over blocks")
        ax.set_title("residual side", fontsize=9)
        ax.legend(fontsize=7)
    return figure_uri(fig)


SINK_MEASURES = {"max_strongest_mass": "strongest head's mass (max over blocks)",
                 "max_prefix_mass": "strongest heads' mass on [CLS] + registers (max)",
                 "mass_share": "share of heads with mass >= 0.3"}


def training_figure(training: dict[str, Any], rows: Sequence[dict[str, Any]]) -> plt.Figure:
    """A run's training curves vs step (docs/report.md); a panel without data says why in words."""
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.4), gridspec_kw={"width_ratios": [1, 1, 1.15, 0.85]})
    series = training.get("series", {})
    loss = series.get("loss")
    if loss:
        axes[0].plot(*zip(*loss, strict=True), "-", lw=1, color="tab:blue", label="training loss")
        if series.get("val/loss"):
            axes[0].plot(*zip(*series["val/loss"], strict=True), "o", ms=4, color="tab:red", label="validation")
        log_axis(axes[0], [v for key in ("loss", "val/loss") for _, v in series.get(key, [])])
        axes[0].legend(fontsize=7)
    else:
        empty_note(axes[0], training.get("missing") or "no training loss in metrics.jsonl")
    axes[0].set_title("loss", fontsize=9)
    probe, val, knn = series.get("probe_acc"), series.get("val/probe_acc"), series.get("val/knn_top1")
    if probe or val or knn:
        for pts, style, kw in ((probe, "-", {"lw": 0.8, "alpha": 0.6, "color": "tab:blue",
                                             "label": "online probe, training batch"}),
                               (val, "o-", {"ms": 4, "color": "tab:red", "label": "online probe, validation"}),
                               (knn, "s--", {"ms": 4, "color": "tab:green", "label": "k-NN, validation"})):
            if pts:
                axes[1].plot(*zip(*[(s, 100 * v) for s, v in pts], strict=True), style, **kw)
        axes[1].set_ylabel("top-1 (%)")
        axes[1].legend(fontsize=7)
        axes[1].set_title("online probe" + (" and k-NN monitor" if knn else ""), fontsize=9)
    elif series.get("val/rel_error"):
        axes[1].plot(*zip(*series["val/rel_error"], strict=True), "o-", ms=4, color="tab:red")
        log_axis(axes[1], [v for _, v in series["val/rel_error"]])
        axes[1].set_ylabel("relative error")
        axes[1].set_title("task error (validation)", fontsize=9)
    else:
        axes[1].set_title("online probe", fontsize=9)
        empty_note(axes[1], training.get("missing") or "no online probe in metrics.jsonl (this objective has none)")
    steps = [r["step"] for r in rows]
    for (key, label), style in zip(SINK_MEASURES.items(), ("o-", "s--", "^:"), strict=True):
        vals = [np.nan if r.get(key) is None else r[key] for r in rows]
        if not all(np.isnan(vals)):
            axes[2].plot(steps, vals, style, ms=4, label=label)
    axes[2].set_ylim(0, 1.05)
    axes[2].set_title("continuous sink measures (diagnosed checkpoints)", fontsize=9)
    if axes[2].lines:
        axes[2].legend(fontsize=7)
    else:
        empty_note(axes[2], "no diagnosed checkpoint has these measures")
    rank = series.get("val/rankme")  # the monitors' keys: vitsinks.objectives.monitors
    axes[3].set_title("RankMe of the validation embeddings", fontsize=9)
    if rank:
        axes[3].plot(*zip(*rank, strict=True), "o-", ms=4, color="tab:purple")
        axes[3].set_ylim(0, 1.1 * max(v for _, v in rank))
        axes[3].set_ylabel("effective rank")
    else:
        empty_note(axes[3], training.get("missing") or "no RankMe in metrics.jsonl (monitors.rankme=false, or "
                                                        "no labelled validation images)")
    for ax in axes:
        if ax.lines:
            ax.set_xlabel("step")
    return fig
