"""The notebook entry points: `diagnose(model, images)` -> tables, `diagnose_fields` -> the raw diagnostics arrays,
`intervene(model, images, heads=..., edits=...)` -> the interventions' rows as a table.

Every function takes a model of an adapted family (or its `Backbone`, `vitsinks.backbones.adapt`). Every block runs
its real forward to move the residual stream on; the diagnosed blocks are also rebuilt from their explicit attention
(the family's views), which must reproduce the real forward (`recompute_error` < `RECOMPUTE_TOL`, else
`CheckFailed`: the tables would describe another computation than the model's). One block's attention matrices are
alive at a time: about `ATTN_COPIES` float32 (B, heads, N, N) arrays, which `batch_size_for` keeps under a budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitsinks.backbones import adapt
from vitsinks.configs.ranges import check_setting, check_settings
from vitsinks.configs.schema import DiagnosticsConfig, InterveneConfig
from vitsinks.diagnostics import run_diagnostics, stretched
from vitsinks.diagnostics.core import chosen_blocks
from vitsinks.diagnostics.core import diagnose as core_diagnose
from vitsinks.diagnostics.fields import FIELDS
from vitsinks.diagnostics.neurons import capture, neuron_k, summarize_neurons
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.interventions import intervene as run_interventions
from vitsinks.models.layout import KeyLayout
from vitsinks.models.passes import eval_mode
from vitsinks.models.seam import Backbone
from vitsinks.posthoc.applied import check_plain
from vitsinks.pretrained.images import ImageSource, as_images
from vitsinks.utils.errors import BadValue

ATTN_COPIES = 4  # float32 (B, H, N, N) arrays alive at once in one block's diagnosis (scores, A, and the fields')
DEFAULT_BUDGET = 2**30  # bytes of attention matrices per batch (`batch_size_for`)
PER_BLOCK_ONLY = ("recompute_error", "res_norm_in")  # fields without an image-by-block layout
DEFAULTS = DiagnosticsConfig()
NEURON_K = neuron_k(DEFAULTS.high_norm_k)  # the register-neuron summary's threshold (5 x the median norm)
NEURON_COLUMNS = ("block", "unit", "rank", "score", "norm_share")


def as_backbone(model: nn.Module | Backbone) -> Backbone:
    """`model` as its family's adapter builds its `Backbone` (a `Backbone` is returned as it is)."""
    if isinstance(model, Backbone):
        return model
    check_plain(model)
    return adapt(model)


def require_float32(backbone: Backbone) -> None:
    """A `BadValue` unless the model computes in float32 (the recomputation checks' tolerances are float32 ones)."""
    dtype = next(backbone.model.parameters()).dtype
    if dtype != torch.float32:
        raise BadValue(f"{backbone.name} holds {dtype} weights: the recomputation checks are float32 ones; use a "
                       f"float32 copy (model.float())")


def check_batch_size(batch_size: int | None) -> None:
    """A `BadValue` for a batch size below 1 (None: chosen by `batch_size_for`)."""
    if batch_size is not None and batch_size < 1:
        raise BadValue(f"batch_size={batch_size}: give a batch of at least 1 image, or None to fit the memory budget")


def check_rules(rules: SinkRules | None) -> None:
    """A `BadValue` for rules the command line would refuse (`rules.eps` out of `diagnostics.eps`'s range)."""
    if rules is not None:
        check_setting(DiagnosticsConfig, "eps", rules.eps, "rules.eps")


def check_labels(labels: Any, n: int) -> torch.Tensor:
    """`labels` as the class indices of `n` images (a long tensor (n,)); another length or no integers: a
    `BadValue`, before any work."""
    got = torch.as_tensor(labels)
    if got.dim() != 1 or len(got) != n:
        raise BadValue(f"labels of shape {tuple(got.shape)} for {n} images: give one class index per image, in the "
                       f"images' order")
    if got.is_floating_point() or got.is_complex() or got.dtype == torch.bool:
        raise BadValue(f"labels are {got.dtype}: give class indices (integers), one per image")
    return got.long()


def model_heads(heads: Any, n_blocks: int) -> Any:
    """`heads` as `tables` and `intervene` take them: (block, head) pairs (tuples, lists or arrays) with a negative
    block counted from the last of the model's `n_blocks`, as `blocks=` counts; head indices and None as they are."""
    if heads is None:
        return None
    out: list[Any] = []
    for h in heads:
        if np.ndim(h) != 1:
            out.append(h)
            continue
        if len(h) != 2:
            raise BadValue(f"heads: {list(h)} is no (block, head) pair")
        b, head = (int(v) for v in h)
        out.append((b + n_blocks if -n_blocks <= b < 0 else b, head))
    return out


def check_shown(shown: np.ndarray, images: torch.Tensor) -> None:
    """A `BadValue` unless `shown` holds `images` as uint8 RGB (n, H, W, 3) at their size, before any work."""
    want = (len(images), *images.shape[-2:], 3)
    if shown.dtype != np.uint8 or shown.shape != want:
        raise BadValue(f"shown must be the images as uint8 RGB {want}, got {shown.dtype} {shown.shape}: "
                       f"pretrained.load(...).shown(images) gives it, or leave it out")


def tokens_per_image(backbone: Backbone, img_size: tuple[int, int]) -> int:
    """[CLS], registers and the patches of an image of `img_size`."""
    rows, cols = backbone.grid(img_size)
    return backbone.num_prefix + rows * cols


def batch_size_for(backbone: Backbone, img_size: tuple[int, int], budget: int = DEFAULT_BUDGET) -> int:
    """The largest batch whose attention matrices (`ATTN_COPIES` float32 (B, heads, N, N) per block) fit in `budget`
    bytes (at least 1). ViT-L/14 at 224 px with 4 registers (16 heads, N = 261): 16.6 MiB per image, a batch of
    61 in 1 GiB; at 518 px (N = 1374): 461 MiB per image, a batch of 2."""
    n = tokens_per_image(backbone, img_size)
    heads = max(b.attn.num_heads for b in backbone.blocks)
    return max(1, budget // (ATTN_COPIES * 4 * heads * n * n))


@torch.no_grad()
def diagnose_fields(model: nn.Module | Backbone, images: ImageSource, blocks: Iterable[int] | None = None,
                    batch_size: int | None = None, keep_maps: int = 0, n_images: int | None = None
                    ) -> dict[str, np.ndarray]:
    """The diagnostics arrays of a pretrained model on `images` (`as_images`): `vitsinks.diagnostics.core.diagnose`,
    the code of `python -m vitsinks.diagnose`, run on the model's backbone, for the chosen `blocks` (default all;
    `block` holds their indices), with the token layout (`num_cls` too) and the QK spectrum. `batch_size` None:
    `batch_size_for` under `DEFAULT_BUDGET`."""
    backbone = as_backbone(model)
    require_float32(backbone)
    check_batch_size(batch_size)
    images = as_images(images, n_images)
    img_size = (int(images.shape[-2]), int(images.shape[-1]))
    chosen = chosen_blocks(len(backbone.blocks), blocks)
    out = core_diagnose(backbone, images, batch_size or batch_size_for(backbone, img_size), keep_maps, blocks=chosen,
                        name=f"{backbone.name} (seen by the {backbone.family} adapter)")
    out.update(backbone.layout_fields(img_size))
    out["block"] = np.array(chosen)
    return out


def sink_location(d: dict[str, np.ndarray]) -> np.ndarray:
    """Where each dominant key sits ("cls", "register", "patch", or an extra key slot's name), from `sink_idx` and
    the layout fields."""
    return KeyLayout.from_fields(d).location(d["sink_idx"])


def _head_fields(d: dict[str, np.ndarray]) -> list[str]:
    """The per-head fields: (images, blocks, heads) arrays beside the fixed ones (a mitigation's, e.g. `gate_mean`)."""
    shape = d["sink_idx"].shape
    extra = [k for k, v in d.items() if k not in (*FIELDS, "prefix_mass", "token_norms") and not k.startswith("res_")
             and v.shape == shape]
    return [*FIELDS, "prefix_mass", *extra]


def tables(d: dict[str, np.ndarray], heads: Sequence[int] | Sequence[tuple[int, int]] | None = None,
           rules: SinkRules | None = None) -> dict[str, dict[str, np.ndarray]]:
    """`diagnose_fields` arrays as tables (dicts of equally long columns):

    - `heads`: one row per (image, block, head): every per-head field, `sink_location`, and under `rules` (default
      the CLI's: `SinkRules()`) `event` (a sink event) and `sink_class` (none, nop, broadcast or other);
    - `blocks`: one row per (image, block): the residual stream's and the attention update's per-image fields;
    - `qk`: one row per (block, head): the QK spectrum;
    - `checks`: one row per block: `recompute_error`;
    - `layout`: one row: [CLS], registers, patches, grid.

    `heads`: keep only these heads (indices, in every block, or (block, head) pairs with model block indices)."""
    check_rules(rules)
    rules = rules or SinkRules()
    n, L, H = d["sink_idx"].shape
    block_ids = d["block"]
    img, blk, head = (a.ravel() for a in np.meshgrid(np.arange(n), block_ids, np.arange(H), indexing="ij"))
    keep = np.ones(img.shape, dtype=bool)
    if heads is not None:
        given: Sequence[Any] = heads  # ints, or (block, head) pairs as tuples, lists or arrays
        chosen: list[Any] = [tuple(int(v) for v in h) if np.ndim(h) == 1 else h for h in given]
        if chosen and isinstance(chosen[0], tuple):
            pairs = {(int(b), int(h)) for b, h in chosen}
            wrong: list[tuple[int, int]] | list[int] = sorted(
                (b, h) for b, h in pairs if b not in set(block_ids.tolist()) or not 0 <= h < H)
            keep = np.array([(b, h) in pairs for b, h in zip(blk, head, strict=True)], dtype=bool)
        else:
            wrong = sorted(h for h in {int(h) for h in chosen} if not 0 <= h < H)
            keep = np.isin(head, np.asarray(chosen, dtype=int))
        if wrong or not chosen:
            raise BadValue(f"heads {wrong or '[]'}: choose heads 0..{H - 1} (or (block, head) pairs of the diagnosed "
                           f"blocks {block_ids.tolist()})")
    per_head = {"image": img, "block": blk, "head": head,
                **{k: d[k].reshape(-1) for k in _head_fields(d)}, "sink_location": sink_location(d).reshape(-1),
                "event": rules.events(d).reshape(-1), "sink_class": rules.event_class(d).reshape(-1)}
    b_img, b_blk = (a.ravel() for a in np.meshgrid(np.arange(n), block_ids, indexing="ij"))
    per_block = {"image": b_img, "block": b_blk,
                 **{k: v.reshape(-1) for k, v in d.items() if v.shape == (n, L) and k not in PER_BLOCK_ONLY}}
    q_blk, q_head = (a.ravel() for a in np.meshgrid(block_ids, np.arange(H), indexing="ij"))
    qk = {"block": q_blk, "head": q_head,
          **{k: d[k].reshape(-1) for k in ("qk_sigma1_frac", "qk_sigma1_over_sigma2")}}
    if heads is not None:
        qk_keep = np.isin(np.arange(len(q_blk)), np.flatnonzero(keep[: L * H]))  # image 0's rows: (block, head)
        qk = {k: v[qk_keep] for k, v in qk.items()}
    layout = {k: np.atleast_1d(d[k]) for k in ("num_cls", "num_registers", "num_prefix", "num_patches")}
    layout["grid"] = np.array([tuple(int(g) for g in d["grid"])], dtype=object)
    return {"heads": {k: v[keep] for k, v in per_head.items()}, "blocks": per_block, "qk": qk,
            "checks": {"block": block_ids, "recompute_error": d["recompute_error"]}, "layout": layout}


def diagnose(model: nn.Module | Backbone, images: ImageSource, blocks: Iterable[int] | None = None,
             heads: Sequence[int] | Sequence[tuple[int, int]] | None = None, batch_size: int | None = None,
             rules: SinkRules | None = None, n_images: int | None = None,
             neurons: bool | float = False) -> dict[str, dict[str, np.ndarray]]:
    """Diagnose an unmodified pretrained ViT on `images` (n, 3, H, W, already normalised for the model; or a
    dataset or DataLoader, `as_images`): the `tables` of `diagnose_fields` (`pandas.DataFrame(result["heads"])`),
    events and classes under `rules` (default `SinkRules()`, the CLI's). `neurons`: also the `neurons` table (the
    register-neuron summary, `neuron_table`, of the chosen blocks; one more forward pass) at the
    summary's high-norm threshold (True: 5 x the median norm) or at the given one (a number)."""
    if isinstance(neurons, np.bool_):
        neurons = bool(neurons)
    if not isinstance(neurons, bool | int | float | np.number):
        raise BadValue(f"neurons={neurons!r}: give True (the summary's threshold), a threshold k > 1, or False")
    if not isinstance(neurons, bool):
        check_setting(DiagnosticsConfig, "high_norm_k", float(neurons), "neurons")
    check_rules(rules)
    backbone = as_backbone(model)
    x = as_images(images, n_images)
    out = tables(diagnose_fields(backbone, x, blocks, batch_size), model_heads(heads, len(backbone.blocks)), rules)
    if neurons is not False:
        t = neuron_table(backbone, x, NEURON_K if neurons is True else float(neurons))
        keep = np.isin(t["block"], out["checks"]["block"])
        out["neurons"] = {k: v[keep] for k, v in t.items()}
    return out


@torch.no_grad()
def neuron_table(backbone: Backbone, images: torch.Tensor, k: float = NEURON_K, top: int = DEFAULTS.register_neurons,
                 batch_size: int = 16) -> dict[str, np.ndarray]:
    """`diagnostics.neurons.summarize_neurons` (docs/residual.md) as a table: one row per (block, unit) of each
    block's `top` units, highest score first: `block`, `unit`, `rank` (0 first), `score` and the block's
    `norm_share`. Blocks without a plain MLP or without outlier patches (norm > `k` x the median) have no row."""
    got = capture(backbone, images, k, batch_size)
    settings = DiagnosticsConfig(high_norm_k=[k], register_neurons=top)
    by_block = summarize_neurons(backbone, None, settings, got)["by_block"]
    rows = [(b, u, r, s, np.nan if e["norm_share"] is None else e["norm_share"])
            for b, e in enumerate(by_block) for r, (u, s) in enumerate(zip(e["units"], e["scores"], strict=True))]
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(NEURON_COLUMNS)
    return {name: np.asarray(col, dtype=float if name in ("score", "norm_share") else int)
            for name, col in zip(NEURON_COLUMNS, cols, strict=True)}


def report(model: nn.Module | Backbone, images: ImageSource, out_dir: str | Path, shown: np.ndarray | None = None,
           settings: DiagnosticsConfig | None = None, n_images: int | None = None, batch_size: int | None = None,
           image_index: list[int] | None = None, selection: Any = None) -> dict[str, Any]:
    """What `python -m vitsinks.diagnose` writes for a checkpoint, for a pretrained model, into `out_dir`:
    `per_image.npz`, `summary.json` (events, NOP / broadcast classes, locations, the residual side), the sink table,
    the PNG plots and the page `report.html` (docs/report.md), by the same code (`diagnostics.run_diagnostics`).
    `shown`: the images as uint8 RGB (n, H, W, 3) for the page, default `diagnostics.stretched(images)`; `settings`: the
    `diagnostics` config group (`DiagnosticsConfig`); `image_index` (each image's index in its dataset) and
    `selection` are recorded as the CLI records them. `out_dir` must be new, empty, or an earlier diagnosis's folder:
    only the files an earlier diagnosis wrote there are replaced, and any other non-empty folder is refused
    (`BadValue`) before any work. Returns the summary."""
    backbone = as_backbone(model)
    require_float32(backbone)
    check_batch_size(batch_size)
    if dataclasses.is_dataclass(settings):  # a notebook's own; the command line's were checked at composition
        check_settings(settings)
    x = as_images(images, n_images)
    if shown is not None:
        check_shown(np.asarray(shown), x)
    bs = batch_size or batch_size_for(backbone, (int(x.shape[-2]), int(x.shape[-1])))
    return run_diagnostics(backbone, x, stretched(x) if shown is None else np.asarray(shown), Path(out_dir),
                           settings or DiagnosticsConfig(), image_index, selection, batch_size=bs)


def columns(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Rows (dicts) as columns, every key of any row (None where a row lacks it)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {k: [r.get(k) for r in rows] for k in keys}


def intervene(model: nn.Module | Backbone, images: ImageSource, heads: Sequence[tuple[int, int]] = (),
              edits: Sequence[str] = (), heldout: ImageSource | None = None, labels: torch.Tensor | None = None,
              batch_size: int = 16, rules: SinkRules | None = None, **settings: Any) -> dict[str, Any]:
    """The causal interventions (`vitsinks.interventions.intervene`, docs/interventions.md) on a pretrained model:
    every edit of `edits` (default: every edit that applies) on every (block, head) of `heads` (default: selected by
    their sink events, `InterveneConfig`'s `min_events`, `top_k`, ... passed as `settings`); `heldout` images are
    the source of `mean_sink_value`. `images` and `heldout` as `diagnose` takes them (`as_images`). Returns `rows`
    (a table: one row per image, head and edit), `checks` (the built-in checks' largest errors), `heads` (those
    edited) and `mean_skipped`. `batch_size` and the settings are checked as the command line checks `intervene.*`;
    `labels`, one class index per image, before any work."""
    backbone = as_backbone(model)
    require_float32(backbone)
    derived = ("n_images", "heldout_images")  # the images' counts
    known = {f.name for f in dataclasses.fields(InterveneConfig)} - set(derived)
    if unknown := sorted(set(settings) - known):
        raise BadValue(f"intervene() got {', '.join(unknown)}: the settings are InterveneConfig's fields "
                       f"({', '.join(sorted(known))})")
    chosen = InterveneConfig(batch_size=batch_size, **settings)
    check_settings(chosen, skip=derived)
    check_rules(rules)
    heads = model_heads(heads, len(backbone.blocks))
    images = as_images(images)
    heldout = images[:0] if heldout is None else as_images(heldout)
    labels = None if labels is None else check_labels(labels, len(images))
    cfg = dataclasses.replace(chosen, n_images=len(images), heldout_images=len(heldout),
                              heads=[f"{b}:{h}" for b, h in heads], edits=list(edits))
    with eval_mode(backbone.model) as device:
        res = run_interventions(backbone, images.to(device), None if labels is None else labels.to(device),
                                heldout.to(device), cfg, rules, progress=False)
    return {"rows": columns(res.rows), "checks": res.checks.as_dict(), "heads": res.heads,
            "mean_skipped": dict(res.mean_skipped), "settings": dataclasses.asdict(cfg)}
