"""The checkpoint's visual report page (docs/report.md): one self-contained HTML page per diagnosed checkpoint
(`checkpoint_report`), rendered from the JSON file beside it that holds every number the page shows."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics.neurons import neuron_k, unsupported_mlp
from vitsinks.diagnostics.page_figures import (
    ATTN_CMAP,
    NORM_CMAP,
    cbar,
    gradient_css,
    grid_picture,
    num,
    page,
    panel,
    pca_colours,
    png_uri,
    residual_figure,
    scale_factor,
    upscale,
)
from vitsinks.diagnostics.rules import BROADCAST_MAX_RANK, BROADCAST_MIN, CLASSES, NOP_MAX, ROUTED_MIN
from vitsinks.diagnostics.summary import LOCATIONS, describe_rule, layout_of
from vitsinks.models import NoMLP
from vitsinks.models.layout import KeyLayout
from vitsinks.models.passes import eval_mode
from vitsinks.models.seam import Backbone
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.plotting import swatches_html
from vitsinks.utils.tables import html_table

REPORT, REPORT_JSON, TRAINING_PNG = "report.html", "report.json", "training_curves.png"

def rounded(x: Any) -> Any:
    """Floats rounded to 6 significant digits (nested lists and arrays too) for the JSON."""
    if isinstance(x, np.ndarray | list | tuple):
        return [rounded(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return None if math.isnan(x) else float(f"{float(x):.6g}")
    return x


# --- the checkpoint page's data ---------------------------------------------------------------------------------
@torch.no_grad()
def final_patches(model: Backbone, images: torch.Tensor) -> np.ndarray:
    """The final-norm patch features (n, P, dim) of `images`, in eval mode."""
    with eval_mode(model) as device:
        return model.forward_features(images.to(device))[:, model.num_prefix:].float().cpu().numpy()


def _prefix(col: np.ndarray, layout: KeyLayout, name: str, agg: Any) -> dict[str, Any]:
    """[CLS]'s value (None without one), each register's, and with registers their `agg` under `name`."""
    regs = col[layout.register_slice]
    return {"cls": rounded(col[0]) if layout.cls else None, "registers": rounded(regs),
            **({name: rounded(agg(regs))} if len(regs) else {})}


def image_maps(d: dict[str, np.ndarray], heads: list[int], i: int) -> dict[str, Any]:
    """One image's maps per block: the strongest head's attention per key and the token norms, with their ranges."""
    layout, (gh, gw) = layout_of(d), (int(g) for g in d["grid"])
    cols = [d["attn_col_mean"][i, b, h].astype(np.float64) for b, h in enumerate(heads)]
    grids = [c[layout.patch_slice].reshape(gh, gw) for c in cols]
    top = max(float(g.max()) for g in grids)  # one colour scale for the image's blocks: comparable side by side
    attn = [{"block": b, "head": int(h), **_prefix(c, layout, "registers_total", np.sum),
             "patches": rounded(g.sum()), "max": rounded(g.max()), "map": rounded(g),
             **({"extra_keys": {name: rounded(c[layout.n_tokens + j]) for j, name in enumerate(layout.extra)}}
                if layout.extra else {})}
            for b, (h, c, g) in enumerate(zip(heads, cols, grids, strict=True))]
    out: dict[str, Any] = {"image": i, "attention_scale": [0.0, rounded(top)], "attention": attn}
    if "image_index" in d:
        out["split_index"] = int(d["image_index"][i])
    if "token_norms" in d:
        out["token_norm"] = []
        for b in range(d["token_norms"].shape[1]):
            norms = d["token_norms"][i, b].astype(np.float64)
            grid = norms[layout.patch_slice].reshape(gh, gw)
            out["token_norm"].append({"block": b, **_prefix(norms, layout, "registers_max", np.max),
                                      "vmin": rounded(grid.min()), "vmax": rounded(grid.max()), "map": rounded(grid)})
    return out


def _residual(res: dict[str, Any] | None, model: Backbone) -> dict[str, Any]:
    """The shown part of summary["residual"] (docs/report.md); a block without register neurons gets `why`."""
    if not res:
        return {}
    keys = ("norm_quantiles_by_block", "high_norm", "top_activations", "register_neurons")
    out: dict[str, Any] = {k: res[k] for k in keys if k in res}
    if "high_norm" in res:
        out["high_norm"] = [{"k": float(k), **v} for k, v in sorted(res["high_norm"].items(), key=lambda kv:
                                                                       float(kv[0]))]
    if "register_neurons" in res:
        k = neuron_k([float(x) for x in res.get("high_norm") or {}] or DiagnosticsConfig().high_norm_k)
        out["register_neurons"] = {**res["register_neurons"], "by_block": [
            e if e["units"] else {**e, "why": _no_neurons(blk, k)}
            for e, blk in zip(res["register_neurons"]["by_block"], model.blocks, strict=True)]}
    return out


def _no_neurons(blk: Any, k: float) -> str:
    """Why a block has no register neurons in the summary."""
    if isinstance(blk.mlp, NoMLP):
        return "none: the block has no MLP"
    if (name := unsupported_mlp(blk)) is not None:
        return f"none: its MLP ({name}) is not a plain fc1 -> act -> fc2"
    return f"none: no patch token above {k:g} x its image's median norm at the last block, so no artifact to rank by"


def checkpoint_data(model: Backbone, images: torch.Tensor, d: dict[str, np.ndarray], summary: dict[str, Any],
                    name: str, n_images: int = 4, quant: dict | None = None,
                    trainfree: dict | None = None) -> dict[str, Any]:
    """Every number of a checkpoint's page (its report.json)."""
    if "attn_col_mean" not in d:
        raise BadValue("the diagnosis holds no attention maps (attn_col_mean): diagnose with keep_maps >= 1 (an "
                       "on-disk per_image.npz leaves them out: re-run the diagnosis)")
    strongest = summary.get("strongest_head_by_block")
    if not strongest:
        raise BadValue("the summary has no strongest_head_by_block: it is older than the report page; re-run the "
                       "diagnosis (python -m vitsinks.diagnose ckpt=...)")
    n = min(n_images, d["attn_col_mean"].shape[0], len(images))
    if n < 1:
        raise BadValue(f"n_images must be >= 1, got {n_images}")
    _, n_blocks, n_heads, _ = d["attn_col_mean"].shape
    rgb, evr = pca_colours(final_patches(model, images[:n]))
    gh, gw = (int(g) for g in d["grid"])
    maps = [image_maps(d, strongest["head"], i) for i in range(n)]
    for m, colours in zip(maps, rgb, strict=True):
        m["pca_map"] = rounded(colours.reshape(gh, gw, 3))
    rule = summary.get("rule")
    return {
        "checkpoint": name,
        "model": {"variant": model.name, "blocks": n_blocks, "heads": n_heads, "registers": int(d["num_registers"]),
                  "grid": [gh, gw], "image_size": list(images.shape[-2:]), "images_shown": n,
                  "images_diagnosed": int(d["mass"].shape[0])},
        "rule": {"text": describe_rule(rule), **(rule or {}), "thresholds": {
            "routed_min": ROUTED_MIN, "nop_max": NOP_MAX, "broadcast_min": BROADCAST_MIN,
            "broadcast_max_rank": BROADCAST_MAX_RANK}},
        "sinks_per_image": summary["sinks_per_image"],
        "sinks_per_image_block0": summary.get("sinks_per_image_block0"),
        "strongest_head_by_block": strongest,
        "images": maps,
        "pca": {"explained_variance_ratio": rounded(evr), "patches": int(n * gh * gw)},
        "residual": _residual(summary.get("residual"), model),
        "depth": {k: summary.get(k) for k in DEPTH_PARTS},
        "quant": _quant(quant),
        "trainfree": trainfree,
        "posthoc": model.family == "vitsinks",  # a hub model read unmodified has no quantize / trainfree results
    }


def _quant(quant: dict[str, Any] | None) -> dict[str, Any] | None:
    """The shown part of the quant result: cosines as 1 - cosine, the checkpoint as `<run>/checkpoints/<file>`."""
    if not quant:
        return quant
    out = {k: v for k, v in quant.items() if k not in ("feature_cosine", "feature_cosine_by_block")}
    ck = Path(str(quant.get("checkpoint") or ""))
    out["checkpoint"] = "/".join(ck.parts[-3:]) if ck.parent.name == "checkpoints" else ck.name
    if quant.get("feature_cosine") is not None:
        out["feature_cosine_error"] = 1.0 - float(quant["feature_cosine"])
    out["feature_cosine_error_by_block"] = [None if c is None else 1.0 - float(c)
                                            for c in quant.get("feature_cosine_by_block") or []]
    return out


# --- the checkpoint page's HTML ---------------------------------------------------------------------------------
def _spi_table(spi: dict[str, dict[str, float]], table_id: str) -> str:
    locations = [loc for loc in spi["all"] if loc != "all"]  # the layout's: the tokens', then any extra key slot
    return html_table(["class", *locations, "all"], [[c, *(num(spi[c][loc]) for loc in (*locations, "all"))]
                                               for c in (*CLASSES, "all")], table_id)


def _settings(obj: dict[str, Any]) -> str:
    """`key value; ...` of a dict's scalars and of its nested dicts' (escaped)."""
    parts = []
    for k, v in obj.items():
        if isinstance(v, dict):
            parts.append(_settings(v))
        elif k != "text":
            shown = ("yes" if v else "no") if isinstance(v, bool) else num(v) if isinstance(v, int | float) else v
            parts.append(html.escape(f"{k.replace('_', ' ')} {shown}"))
    return "; ".join(parts)


def _headline(data: dict[str, Any]) -> str:
    s = data["strongest_head_by_block"]
    head = ["block", "head", "mass", "sink at", "value ratio", *(["mass on [CLS]+reg"] if "prefix_mass" in s else [])]
    rows = [[num(b), num(s["head"][b]), num(s["mass"][b]), s["location"][b], num(s["ratio"][b]),
             *([num(s["prefix_mass"][b])] if "prefix_mass" in s else [])] for b in range(len(s["head"]))]
    block0 = data.get("sinks_per_image_block0")
    spi = f"<div><h3>blocks {html.escape(data['rule'].get('blocks_counted', '1..L-1'))}</h3>" \
          f"{_spi_table(data['sinks_per_image'], 'sinks-per-image')}</div>"
    if block0:
        spi += f"<div><h3>block 0</h3>{_spi_table(block0, 'sinks-per-image-block0')}</div>"
    return panel("headline", "Sinks per image by class and location", f"""
<p class="note">Counted with: {html.escape(data['rule']['text'])}. Settings: {_settings(data['rule'])}.</p>
<p class="legend">classes in the figures: {swatches_html(CLASSES)}</p>
<div class="row">{spi}<div><h3>strongest head per block (mean over all diagnosed images)</h3>
{html_table(head, rows, 'strongest-heads')}</div></div>""")


def _bar(shares: list[tuple[str, float]], title: str) -> str:
    total = sum(max(v, 0.0) for _, v in shares) or 1.0
    parts = "".join(f'<span class="{c}" style="width:{100 * max(v, 0.0) / total:.2f}%"></span>' for c, v in shares)
    return f'<div class="bar" title="{html.escape(title)}">{parts}</div>'


def _attn_tile(a: dict[str, Any], scale: list[float], size: tuple[int, int]) -> str:
    lo, hi = scale
    pic = png_uri(grid_picture(np.array(a["map"]), lo, hi, ATTN_CMAP, size))
    regs = a["registers"]
    extra = a.get("extra_keys", {})  # the key layout's extra slots (a null key, attention biases)
    has_cls = a["cls"] is not None  # None: a model without [CLS]
    cls_tip = f"[CLS] {num(a['cls'])}; " if has_cls else ""
    tip = cls_tip + "".join(f"register {j} {num(v)}; " for j, v in enumerate(regs)) + \
        f"patches {num(a['patches'])}" + "".join(f"; {name} key {num(v)}" for name, v in extra.items())
    shares = [*([("cls", a["cls"])] if has_cls else []), *(("reg", v) for v in regs), ("patch", a["patches"]),
              *(("extra", v) for v in extra.values())]
    reg = f" · reg {num(a['registers_total'])}" if regs else ""
    reg += "".join(f" · {name} key {num(v)}" for name, v in extra.items())
    caption = f"[CLS] {num(a['cls'])}{reg} · " if has_cls else f"{reg[3:]} · " if reg else ""
    return (f'<div class="tile"><div class="cap">head {num(a["head"])}: max {num(a["max"])}</div>'
            f'<img class="map" src="{pic}" alt="block {num(a["block"])} head {num(a["head"])} attention">'
            f'{_bar(shares, tip)}<div class="cap" title="{html.escape(tip)}">{caption}'
            f'patches {num(a["patches"])}</div></div>')


def _norm_tile(t: dict[str, Any], size: tuple[int, int]) -> str:
    pic = png_uri(grid_picture(np.array(t["map"]), t["vmin"], t["vmax"], NORM_CMAP, size))
    regs = t["registers"]
    reg = f" · reg max {num(t['registers_max'])}" if regs else ""
    prefix = [*([t["cls"]] if t["cls"] is not None else []), *regs]  # no [CLS] value without a [CLS]
    tip = "; ".join([*([f"[CLS] {num(t['cls'])}"] if t["cls"] is not None else []),
                     *(f"register {j} {num(v)}" for j, v in enumerate(regs))])
    top = bool(prefix) and max(prefix) > t["vmax"]
    caption = f"[CLS] {num(t['cls'])}{reg}" if t["cls"] is not None else reg[3:]
    return (f'<div class="tile"><div class="cap">{num(t["vmin"])} to {num(t["vmax"])}</div>'
            f'<img class="map" src="{pic}" alt="block {num(t["block"])} token norms">'
            f'<div class="cap{" hot" if top else ""}" title="{html.escape(tip)}">{caption}</div>'
            f"</div>")


def _image_card(m: dict[str, Any], shown: np.ndarray, n_blocks: int) -> str:
    h, w = shown.shape[:2]
    f = scale_factor(max(h, w))
    size = (h * f, w * f)
    img = png_uri(upscale(shown, size))
    pca = png_uri(upscale((np.array(m["pca_map"]) * 255).round().astype(np.uint8), size))
    where = f" (index {num(m['split_index'])} in its split)" if "split_index" in m else ""
    heads = "".join(f'<div class="colhead">block {num(b)}</div>' for b in range(n_blocks))
    attn = "".join(_attn_tile(a, m["attention_scale"], size) for a in m["attention"])
    lo, hi = m["attention_scale"]
    norms = "".join(_norm_tile(t, size) for t in m.get("token_norm", []))
    norm_row = (f'<div class="rowhead">token norm</div><div class="tile"><div class="cap">PCA colours</div>'
                f'<img class="map" src="{pca}" alt="PCA"></div>{norms}') if norms else \
        (f'<div class="rowhead">PCA</div><div class="tile"><img class="map" src="{pca}" alt="PCA"></div>'
         f'<div class="note wide">no token norms in this diagnosis (d["token_norms"] absent)</div>')
    return f"""<div class="card"><h3>image {num(m['image'])}{where}</h3><p class="scale">attention coloured
{cbar(gradient_css(ATTN_CMAP), num(lo), num(hi))} (this image's largest patch value over its blocks)</p>
<div class="maps" style="grid-template-columns:5.5em repeat({n_blocks + 1}, minmax(0, 1fr))">
<div></div><div class="colhead">input</div>{heads}
<div class="rowhead">strongest head's attention</div><div class="tile"><div class="cap">as the model saw it</div>
<img class="map" src="{img}" alt="input image"></div>{attn}
{norm_row}</div></div>"""


def _maps(data: dict[str, Any], shown: np.ndarray) -> str:
    n_blocks = data["model"]["blocks"]
    evr = data["pca"]["explained_variance_ratio"]
    legend = (f'<div class="legend">{cbar(gradient_css(ATTN_CMAP), "0", "image max")} attention each patch '
              f"receives (mean over queries) from the block's strongest head, one scale per image; the bar: its "
              f"shares on "
              f'[CLS] <span class="sw cls"></span>, registers <span class="sw reg"></span>, patches '
              f'<span class="sw patch"></span></div>'
              f'<div class="legend">{cbar(gradient_css(NORM_CMAP), "tile min", "tile max")} L2 norm of each patch '
              f"token of the residual stream after the block; [CLS] and registers as numbers (red: above every "
              f"patch)</div>"
              f'<div class="legend">PCA colours: the final patch features\' first three principal components as red, '
              f"green, blue (fitted over the {num(data['pca']['patches'])} patches of these images; variance shares "
              f"{' / '.join(num(v) for v in evr)})</div>")
    cards = "".join(_image_card(m, shown[m["image"]], n_blocks) for m in data["images"])
    return panel("maps", "Attention, token norms and PCA per image and block", legend + cards)


DEPTH_PARTS = ("head_shape", "sink_lifetime", "massive_emergence")  # summary.json's parts the depth panel shows


def _depth_html(depth: dict[str, Any]) -> str:
    """The panel of summary.json's `head_shape`, `sink_lifetime` and `massive_emergence` (docs/sinks.md)."""
    shape, life, emerge = (depth.get(k) or {} for k in DEPTH_PARTS)
    if not (shape or life or emerge):
        return panel("depth", "Heads and depth", '<p class="note">Not in this summary (it is older than these '
                     "measures: re-run the diagnosis).</p>")
    notes = []
    if life:
        where = ", ".join(f"{k} {num(v)}" for k, v in life["span_by_location"].items() if v is not None)
        notes.append(f"Sink keys per image (a key that is a sink in some block): {num(life['keys_per_image'])}; their "
                     f"mean lifetime {num(life['mean_span'])} blocks" + (f" ({where})." if where else "."))
    if emerge:
        notes.append(f"Massive tokens (norm above {num(emerge['k'])}x the median of their image and block): on "
                     f"{num(emerge['images_with'])} of the images, the first at block {num(emerge['first_block'])} "
                     f"(median); their norm's coefficient of variation afterwards {num(emerge['cv'])}.")
    conc = shape.get("concentration_by_block")
    given: dict[str, list | None] = {
        "concentration (median)": None if conc is None else [math.inf if v is None else v for v in conc],
        "attention on itself": shape.get("diag_mass_by_block"), "head utilisation": shape.get("head_util_by_block"),
        "sink keys starting": life.get("starts_by_block"), "ending": life.get("ends_by_block"),
        "massive tokens appearing": emerge.get("new_by_block"), "their CV afterwards": emerge.get("cv_by_block")}
    columns = {k: v for k, v in given.items() if v is not None}
    n_blocks = max(len(v) for v in columns.values())
    rows = [[num(b), *(num(v[b]) for v in columns.values())] for b in range(n_blocks)]
    return panel("depth", "Heads and depth", "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes) +
                 "<h3>per block (concentration: a head's largest over its median column sum, median over images and "
                 "heads; per image: sink keys and massive tokens)</h3>" +
                 html_table(["block", *columns], rows, "depth-blocks"))


def _residual_html(res: dict[str, Any]) -> str:
    if not res:
        return panel("residual", "Residual side", '<p class="note">No residual measures in this summary '
                     "(summary.json has no `residual`: diagnostics.residual was off, or it is older).</p>")
    parts = []
    q, top = res.get("norm_quantiles_by_block"), res.get("top_activations")
    if q or top:
        parts.append(f'<img class="fig" src="{residual_figure(q, top and top["ratio_by_block"])}" '
                     f'alt="residual measures per block">')
        n_blocks = len(next(iter(q.values()))) if q else len(top["ratio_by_block"]) if top else 0
        head = ["block", *(q or {}), *(["top", "second", "third", "median", "ratio", "channel", "at"] if top else [])]
        rows = [[num(b), *(num(v[b]) for v in (q or {}).values()),
                 *([*(num(v) for v in top["top_by_block"][b]), num(top["median_by_block"][b]),
                    num(top["ratio_by_block"][b]), num(top["channel_by_block"][b]), top["location_by_block"][b]]
                   if top else [])] for b in range(n_blocks)]
        parts.append(f"<h3>token-norm quantiles and top activations (|activation| of the residual stream) per block"
                     f"</h3>{html_table(head, rows, 'residual-blocks')}")
    notes = [f"{what}: not in this summary." for key, what in (
        ("norm_quantiles_by_block", "norm quantiles"), ("top_activations", "top activations"),
        ("high_norm", "high-norm tokens"), ("register_neurons", "register neurons")) if key not in res]
    if "high_norm" in res:
        hn = res["high_norm"]
        blocks = len(hn[0]["per_image_by_block"]) if hn else 0
        head = ["block", *(f"> {num(e['k'])}x: {c}" for e in hn for c in ("per image", "[CLS] / reg / patch",
                                                                        "sink share"))]
        rows = [[num(b), *(c for e in hn for c in (
            num(e["per_image_by_block"][b]), " / ".join(num(e["location_by_block"][loc][b]) for loc in LOCATIONS),
            num(e["sink_share_by_block"][b])))] for b in range(blocks)]
        parts.append("<h3>high-norm tokens per block: norm above k x the median norm of their image and block "
                     "(&gt; kx) at its output: how many per image, where they sit (per image); sink share: of those "
                     "entering the block (the previous block's output), the share that are its sinks</h3>"
                     f"{html_table(head, rows, 'high-norm')}")
    if "register_neurons" in res:
        rows = [[num(b), e.get("why") or ", ".join(f"{num(u)} ({num(s)})" for u, s in zip(e["units"], e["scores"],
                                                                                          strict=True)),
                 num(e.get("norm_share"))] for b, e in enumerate(res["register_neurons"]["by_block"])]
        parts.append(f"<h3>register neurons per block: MLP units (score), highest first</h3>"
                     f"{html_table(['block', 'units (score)', 'norm share'], rows, 'register-neurons')}")
    body = "".join(parts) + "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    return panel("residual", "Residual side", body)


def _quant_html(quant: dict[str, Any] | None) -> str:
    if not quant:
        return panel("quant", "Quantization", '<p class="note">No quantization result for this checkpoint '
                     "(python -m vitsinks.quantize writes results/quant.json).</p>")
    top = [[k, *(num(quant[k].get(c)) for c in ("fp32", "quant", "delta"))] for k in ("online_top1", "linear_top1")
           if quant.get(k)] + [[k, *(num(v.get(c)) for c in ("fp32", "quant", "delta"))]
                               for k, v in (quant.get("dense") or {}).items()]
    bb = quant.get("by_block") or {}
    layers = list(next(iter(bb.values()), {}))
    cos = quant.get("feature_cosine_error_by_block") or []
    n_blocks = max([len(cos), *(len(v) for m in bb.values() for v in m.values())])
    head = ["block", *(f"{m} {layer}" for m in bb for layer in layers), *(["1 - feature cosine"] if cos else [])]
    rows = [[num(b), *(num(bb[m][layer][b]) for m in bb for layer in layers), *([num(cos[b])] if cos else [])]
            for b in range(n_blocks)]
    meta = (f"{html.escape(str(quant.get('checkpoint', '')))}: weights {num(quant.get('weight_bits'))} bits, inputs "
            f"{num(quant.get('act_bits'))} bits, ranges calibrated on {num(quant.get('calib_images'))} images, "
            f"measured on {num(quant.get('n_images'))}; 1 - cosine of the final features to fp32's: "
            f"{num(quant.get('feature_cosine_error'))}.")
    tops = html_table(["result", "fp32", "quantized", "change"], top, "quant-top") if top else (
        '<p class="note">No probe to compare: the checkpoint has no online probe, and no linear or dense result of '
        "it was probed again quantized.</p>")
    return panel("quant", "Quantization", f"<p>{meta}</p>{tops}"
                 f"<h3>per block: kurtosis and inf-norm of each linear layer's input</h3>"
                 f"{html_table(head, rows, 'quant-blocks')}")


def _trainfree_html(tf: dict[str, Any] | None) -> str:
    if not tf:
        return panel("trainfree", "Training-free mitigation", '<p class="note">None: the backbone as trained.</p>')
    rows = [[k, num(v) if isinstance(v, int | float) else html.escape(str(v))] for k, v in tf.items()]
    return panel("trainfree", "Training-free mitigation", "<p>This backbone was edited after training:</p>" +
                 html_table(["setting", "value"], rows, "trainfree"))


def checkpoint_html(data: dict[str, Any], shown: np.ndarray) -> str:
    """The checkpoint page from its data (`checkpoint_data`) and the images as the model saw them."""
    m = data["model"]
    meta = (f"{html.escape(m['variant'])}: {num(m['blocks'])} blocks x {num(m['heads'])} heads, "
            f"{num(m['registers'])} registers, {num(m['grid'][0])} x {num(m['grid'][1])} patches at "
            f"{num(m['image_size'][0])} x {num(m['image_size'][1])} px; {num(m['images_shown'])} of the "
            f"{num(m['images_diagnosed'])} diagnosed images shown.")
    body = _headline(data) + _maps(data, shown) + _residual_html(data["residual"]) + _depth_html(data.get("depth", {}))
    nav = [("headline", "sinks"), ("maps", "maps"), ("residual", "residual"), ("depth", "depth")]
    if data.get("posthoc", True):  # vitsinks' own checkpoints: the quantize and trainfree commands' panels
        body += _quant_html(data["quant"]) + _trainfree_html(data["trainfree"])
        nav += [("quant", "quantization"), ("trainfree", "training-free")]
    return page(f"Sink report: {data['checkpoint']}", meta, body, nav)


def checkpoint_report(model: Backbone, images: torch.Tensor, shown: np.ndarray, d: dict[str, np.ndarray],
                      summary: dict, out_dir: Path, n_images: int = 4, quant: dict | None = None,
                      trainfree: dict | None = None, name: str | None = None) -> Path:
    """Write `out_dir/report.html` and `report.json` for one diagnosed checkpoint (`d` from `diagnose`, `summary`
    from `summarize`, `shown` the images as uint8 RGB (n, H, W, 3), the first `n_images` shown; `quant` a
    results/quant.json, `trainfree` an edited backbone's settings; `name` the title); returns the page's path."""
    out_dir, shown = Path(out_dir), np.asarray(shown)
    if shown.ndim != 4 or shown.shape[-1] != 3 or shown.dtype != np.uint8 or len(shown) < min(n_images, len(images)):
        raise BadValue(f"shown must hold the images as uint8 RGB (n, H, W, 3), one per image, got {shown.dtype} "
                       f"{shown.shape}: pass the `shown` of `fixed_images` / `images_of` (a pretrained model's: "
                       f"pretrained.load(...).shown(images))")
    data = checkpoint_data(model, images, d, summary, name or out_dir.name, n_images, quant, trainfree)
    files.write_json(out_dir / REPORT_JSON, data)
    files.write_text(out_dir / REPORT, checkpoint_html(data, shown))
    return out_dir / REPORT
