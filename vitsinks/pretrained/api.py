"""The notebook entry points, on a model of an adapted family (or its `Backbone`): `diagnose` -> tables,
`diagnose_fields` -> the raw diagnostics arrays, `intervene` -> the interventions' rows, `report` -> the CLI's files.
The diagnosed blocks' explicit recomputation must reproduce their real forward (else `CheckFailed`).
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
from vitsinks.diagnostics.persistence import head_lifetimes
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


def float32_backbone(model: nn.Module | Backbone) -> Backbone:
    """`as_backbone(model)`; a `BadValue` unless it computes in float32 (the recomputation checks' tolerances)."""
    backbone = as_backbone(model)
    dtype = next(backbone.model.parameters()).dtype
    if dtype != torch.float32:
        raise BadValue(f"{backbone.name} holds {dtype} weights: the recomputation checks are float32 ones; use a "
                       f"float32 copy (model.float())")
    return backbone


def check_batch_size(batch_size: int | None) -> None:
    """A `BadValue` for a batch size below 1 (None: chosen by `batch_size_for`)."""
    if batch_size is not None and batch_size < 1:
        raise BadValue(f"batch_size={batch_size}: give a batch of at least 1 image, or None to fit the memory budget")


def check_rules(rules: SinkRules | None) -> None:
    """A `BadValue` for rules the command line would refuse (`rules.eps` out of `diagnostics.eps`'s range)."""
    if rules is not None:
        check_setting(DiagnosticsConfig, "eps", rules.eps, "rules.eps")


def check_labels(labels: Any, n: int) -> torch.Tensor:
    """`labels` as the class indices (a long tensor) of `n` images; else a `BadValue`."""
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


def batch_size_for(backbone: Backbone, img_size: tuple[int, int], budget: int = DEFAULT_BUDGET) -> int:
    """The largest batch (at least 1) whose attention matrices (`ATTN_COPIES` float32 (B, heads, N, N) per block) fit
    in `budget` bytes: for ViT-L/14 with 4 registers, 61 at 224 px, 2 at 518 px in 1 GiB."""
    n = backbone.key_layout(img_size).n_tokens
    heads = max(b.attn.num_heads for b in backbone.blocks)
    return max(1, budget // (ATTN_COPIES * 4 * heads * n * n))


@torch.no_grad()
def diagnose_fields(model: nn.Module | Backbone, images: ImageSource, blocks: Iterable[int] | None = None,
                    batch_size: int | None = None, keep_maps: int = 0, n_images: int | None = None
                    ) -> dict[str, np.ndarray]:
    """The diagnostics arrays of a pretrained model on `images` (`as_images`), by the code of `python -m
    vitsinks.diagnose`, for the chosen `blocks` (default all; `block` holds their indices), with the token layout and
    the QK spectrum. `batch_size` None: `batch_size_for` under `DEFAULT_BUDGET`."""
    backbone = float32_backbone(model)
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
    """Where each dominant key sits ("cls", "register", "patch", or an extra key slot's name)."""
    return KeyLayout.from_fields(d).location(d["sink_idx"])


def _head_fields(d: dict[str, np.ndarray]) -> list[str]:
    """The per-head fields: (images, blocks, heads) arrays beside the fixed ones (a mitigation's, e.g. `gate_mean`)."""
    shape = d["sink_idx"].shape
    extra = [k for k, v in d.items() if k not in (*FIELDS, "prefix_mass", "token_norms") and not k.startswith("res_")
             and v.shape == shape]
    return [*FIELDS, "prefix_mass", *extra]


def tables(d: dict[str, np.ndarray], heads: Sequence[int] | Sequence[tuple[int, int]] | None = None,
           rules: SinkRules | None = None) -> dict[str, dict[str, np.ndarray]]:
    """`diagnose_fields` arrays as tables (dicts of equally long columns): `heads` (per image, block and head: the
    per-head fields, `sink_location`, and under `rules` `event`, `sink_class` and the lifetime of the dominant key,
    `sink_first` / `sink_last`), `blocks` (per image and block),
    `qk` (per block and head: the QK spectrum), `checks` (per block: `recompute_error`) and `layout` (one row).
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
    ev = rules.events(d)
    lifetimes = head_lifetimes(d["sink_idx"], ev, KeyLayout.from_fields(d).n_keys, block_ids)
    per_head = {"image": img, "block": blk, "head": head,
                **{k: d[k].reshape(-1) for k in _head_fields(d)}, "sink_location": sink_location(d).reshape(-1),
                "event": ev.reshape(-1), "sink_class": rules.event_class(d).reshape(-1),
                **{k: v.reshape(-1) for k, v in lifetimes.items()}}
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
    """Diagnose an unmodified pretrained ViT on `images` (normalised for the model; `as_images`): the `tables` of
    `diagnose_fields`, events and classes under `rules` (default the CLI's). `neurons`: also the `neurons` table
    (`neuron_table` of the chosen blocks) at the summary's high-norm threshold (True) or at the given one."""
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
    """The register-neuron summary (docs/residual.md) as a table: `block`, `unit`, `rank`, `score`, the block's
    `norm_share`, for each block's `top` units (none without a plain MLP or patches of norm > `k` x the median)."""
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
    """What `python -m vitsinks.diagnose` writes (docs/report.md), for a pretrained model, into `out_dir` (new, empty
    or an earlier diagnosis's: any other non-empty folder is refused before any work); returns the summary.
    `shown`: the images as uint8 RGB (n, H, W, 3) for the page (default `diagnostics.stretched(images)`);
    `settings`: a `DiagnosticsConfig`; `image_index` and `selection` are recorded as the CLI records them."""
    backbone = float32_backbone(model)
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
    """The causal interventions (docs/interventions.md) on a pretrained model: every edit of `edits` (default: every
    one that applies) on every (block, head) of `heads` (default: by their sink events, `InterveneConfig`'s fields
    as `settings`); `heldout` images are the source of `mean_sink_value`. Returns `rows` (one per image, head and
    edit), `checks`, `heads`, `mean_skipped` and `settings`; the arguments are checked before any work."""
    backbone = float32_backbone(model)
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
