"""Sink events, NOP / broadcast classification, sink locations, and the per-checkpoint summary."""

from __future__ import annotations

from typing import Any

import numpy as np

from vitsinks.utils.errors import BadValue

LOCATIONS = ("cls", "register", "patch")
CLASSES = ("nop", "broadcast", "unclassified")
NOP_MAX, BROADCAST_MIN, BROADCAST_MAX_RANK = 0.2, 0.5, 1.5


def events(d: dict[str, np.ndarray], rule: str = "relaxed", eps: float = 0.5) -> np.ndarray:
    """Boolean sink events (images, blocks, heads): `relaxed` (routed_frac >= 0.9) or `def1` (min_a >= 1 - eps)."""
    if rule == "relaxed":
        return d["routed_frac"] >= 0.9
    if rule == "def1":
        if not 0 < eps <= 0.5:
            raise BadValue(f"Definition 1 needs 0 < eps <= 0.5, got {eps}")
        return d["min_a"] >= 1 - eps
    raise BadValue(f"unknown sink rule {rule!r}: use relaxed or def1")


def classify(d: dict[str, np.ndarray], ratio: str = "ratio_out", use_rank: bool = True) -> np.ndarray:
    """0 NOP-like (ratio <= 0.2), 1 broadcast-like (ratio >= 0.5 and stable rank <= 1.5), 2 unclassified.

    `ratio="ratio_head", use_rank=False` is the ratio-only rule of the reference numbers (docs/fidelity.md).
    """
    r = d[ratio]
    broadcast = r >= BROADCAST_MIN
    if use_rank:
        broadcast &= d["stable_rank"] <= BROADCAST_MAX_RANK
    return np.where(r <= NOP_MAX, 0, np.where(broadcast, 1, 2))


def token_location(index: np.ndarray, num_registers: int) -> np.ndarray:
    """Where token indices sit: 0 [CLS] (or a sequence's first token), 1 register, 2 patch."""
    return np.where(index == 0, 0, np.where(index <= num_registers, 1, 2))


def location(d: dict[str, np.ndarray]) -> np.ndarray:
    """Where each dominant key sits: 0 [CLS], 1 register, 2 patch."""
    return token_location(d["sink_idx"], int(d["num_registers"]))


def _fmt(x: float) -> float:
    return float(np.round(x, 6))


def sinks_per_image(ev: np.ndarray, cls: np.ndarray, loc: np.ndarray) -> dict[str, dict[str, float]]:
    """Events summed over heads and the given blocks, averaged over images; split by class x location."""
    out: dict[str, dict[str, float]] = {}
    for ci, cname in enumerate((*CLASSES, "all")):
        row = {}
        for li, lname in enumerate((*LOCATIONS, "all")):
            m = ev.copy()
            if cname != "all":
                m &= cls == ci
            if lname != "all":
                m &= loc == li
            row[lname] = _fmt(m.sum(axis=(1, 2)).mean()) if m.size else 0.0
        out[cname] = row
    return out


DEF1_EPS = (0.5, 0.3, 0.2, 0.1)  # the reference's sensitivity table
MASS_SHARE_MIN = 0.3


def scored_blocks(n_blocks: int, block0: bool = False) -> slice:
    """The blocks that sinks per image count: 1..L-1 as in the reference (block 0 is reported apart), every block
    with `block0`, or the only block of a one-block model."""
    return slice(1, None) if n_blocks > 1 and not block0 else slice(0, None)


def blocks_label(n_blocks: int, block0: bool = False) -> str:
    """How `scored_blocks` reads in a summary or a table header."""
    if n_blocks == 1:
        return "0 (the only block)"
    return "0..L-1" if block0 else "1..L-1"


def rule_record(rule: str, eps: float, ratio: str, use_rank: bool, n_blocks: int,
                block0: bool = False) -> dict[str, Any]:
    """The settings a sink count was made with, as stored in summary.json (`rule`) and read by the leaderboard."""
    return {"events": str(rule), "eps": float(eps), "ratio": str(ratio), "use_stable_rank": bool(use_rank),
            "blocks_counted": blocks_label(n_blocks, block0)}


def describe_rule(r: dict[str, Any] | None) -> str:
    """One readable line for a `rule_record` (None: a summary written before the rule was recorded)."""
    if not r:
        return "rule not recorded (a summary older than the rule record)"
    events_ = ("relaxed rule (routed_frac >= 0.9)" if r["events"] == "relaxed"
               else f"Definition 1 (min_a >= 1 - eps, eps {r['eps']:g})")
    rank = f" and stable rank <= {BROADCAST_MAX_RANK:g}" if r["use_stable_rank"] else ", no stable-rank test"
    return (f"{events_}; NOP-like {r['ratio']} <= {NOP_MAX:g}, broadcast-like {r['ratio']} >= {BROADCAST_MIN:g}"
            f"{rank}; blocks {r['blocks_counted']}")


def strongest_heads(d: dict[str, np.ndarray], ratio: str = "ratio_out") -> dict[str, list]:
    """Per block, the head with the largest mean sink mass (max over heads of the mean over images of `mass`):
    its index, that mass, where its dominant key sits most often ([CLS] / register / patch), the median value
    ratio of that key, and its mean attention on the prefix tokens ([CLS] + registers)."""
    mean_mass = d["mass"].mean(axis=0)  # (L, H)
    heads = mean_mass.argmax(axis=1)
    blocks = np.arange(len(heads))
    loc = location(d)[:, blocks, heads]  # (images, L)
    out = {
        "head": heads.tolist(),
        "mass": [_fmt(x) for x in mean_mass[blocks, heads]],
        "location": [LOCATIONS[int(np.bincount(loc[:, b], minlength=3).argmax())] for b in blocks],
        "ratio": [_fmt(x) for x in np.nanmedian(d[ratio][:, blocks, heads], axis=0)],
    }
    if "prefix_mass" in d:
        out["prefix_mass"] = [_fmt(x) for x in d["prefix_mass"].mean(axis=0)[blocks, heads]]
    return out


def continuous_measures(d: dict[str, np.ndarray], ratio: str = "ratio_out", use_rank: bool = True) -> dict[str, Any]:
    """Measures that move before any sink event: the strongest head per block, the share of (image, head) pairs
    with mass >= 0.3, Definition-1 counts at several eps (sinks per image, by class), and the mean gate."""
    cls = classify(d, ratio, use_rank)
    blocks = scored_blocks(d["mass"].shape[1])
    strong = d["mass"] >= MASS_SHARE_MIN
    def1 = {}
    for eps in DEF1_EPS:
        ev = events(d, "def1", eps)[:, blocks]
        def1[str(eps)] = {"all": _fmt(ev.sum(axis=(1, 2)).mean()),
                          **{name: _fmt((ev & (cls[:, blocks] == i)).sum(axis=(1, 2)).mean())
                             for i, name in enumerate(CLASSES[:2])}}
    out: dict[str, Any] = {
        "strongest_head_by_block": strongest_heads(d, ratio),
        "mass_share_by_block": [_fmt(x) for x in strong.mean(axis=(0, 2))],
        "mass_share": _fmt(strong.mean()),
        "def1_sinks_per_image": def1,
    }
    if "gate_mean" in d and not np.isnan(d["gate_mean"]).all():
        out["gate_mean_by_block"] = [_fmt(x) for x in d["gate_mean"].mean(axis=(0, 2))]
    return out


def update_measures(d: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per block: the common-mode penalty of the attention update over the diagnosed images (docs/fidelity.md), and
    for models with the global pathway its pooling entropy, where its top pooled token sits most often, its mean
    recipient gate and its share of the block update's energy."""
    out: dict[str, Any] = {}
    if "cm_num" in d:
        out["common_mode_by_block"] = [_fmt(x) for x in d["cm_num"].mean(0) / np.maximum(d["cm_den"].mean(0), 1e-30)]
    if "pw_share" in d:
        top = d["pw_top_token"]
        loc = token_location(top, int(d["num_registers"]))
        has = ~np.isnan(d["pw_share"]).all(axis=0)
        out["pathway"] = {
            "entropy_by_block": [_fmt(x) if h else None for x, h in zip(d["pw_entropy"].mean(0), has, strict=True)],
            "top_token_by_block": [LOCATIONS[int(np.bincount(loc[:, b], minlength=3).argmax())] if h else None
                                   for b, h in enumerate(has)],
            "gamma_mean_by_block": [_fmt(x) if h else None for x, h in zip(d["pw_gamma"].mean(0), has, strict=True)],
            "share_by_block": [_fmt(x) if h else None for x, h in zip(d["pw_share"].mean(0), has, strict=True)],
        }
    return out


def summarize(d: dict[str, np.ndarray], rule: str = "relaxed", eps: float = 0.5, ratio: str = "ratio_out",
              use_rank: bool = True) -> dict[str, Any]:
    """The JSON summary of one diagnosed checkpoint (see the README's diagnostics section)."""
    ev, cls, loc = events(d, rule, eps), classify(d, ratio, use_rank), location(d)
    n_img, n_blocks, n_heads = ev.shape
    blocks = scored_blocks(n_blocks)
    massive_loc = token_location(d["massive_token"], int(d["num_registers"]))
    sink_heads = ev.any(axis=0)
    return {
        "rule": rule_record(rule, eps, ratio, use_rank, n_blocks),
        "shape": {"images": n_img, "blocks": n_blocks, "heads": n_heads,
                  "registers": int(d["num_registers"])},
        "sinks_per_image": sinks_per_image(ev[:, blocks], cls[:, blocks], loc[:, blocks]),
        "sinks_per_image_block0": sinks_per_image(ev[:, :1], cls[:, :1], loc[:, :1]),
        "block_frequency": [_fmt(x) for x in ev.mean(axis=(0, 2))],
        "max_mass_by_block": [_fmt(x) for x in d["mass"].max(axis=2).mean(axis=0)],  # strongest head, per image
        "head_frequency": [[_fmt(x) for x in row] for row in ev.mean(axis=0)],
        "location_by_block": {name: [_fmt(x) for x in ((loc == i) & ev).sum(axis=2).mean(axis=0)]
                              for i, name in enumerate(LOCATIONS)},
        "class_by_block": {name: [_fmt(x) for x in ((cls == i) & ev).sum(axis=2).mean(axis=0)]
                           for i, name in enumerate(CLASSES)},
        "spectrum": {
            "sigma1_frac_by_block": [_fmt(x) for x in d["qk_sigma1_frac"].mean(axis=1)],
            "sigma1_frac_sink_heads": _fmt(d["qk_sigma1_frac"][sink_heads].mean()) if sink_heads.any() else None,
            "sigma1_frac_other_heads": _fmt(d["qk_sigma1_frac"][~sink_heads].mean()) if (~sink_heads).any()
            else None,
            "sigma1_over_sigma2_max": _fmt(np.max(d["qk_sigma1_over_sigma2"])),
        },
        "massive_activations": {
            "ratio_by_block": [_fmt(x) for x in np.median(d["massive_ratio"], axis=0)],
            "max_norm_by_block": [_fmt(x) for x in np.median(d["token_norm_max"], axis=0)],
            "location_share_by_block": {name: [_fmt(x) for x in (massive_loc == i).mean(axis=0)]
                                        for i, name in enumerate(LOCATIONS)},
        },
        **continuous_measures(d, ratio, use_rank),
        **update_measures(d),
        "recompute_error_max": float(np.max(d["recompute_error"])),  # unrounded: JSON writes 3.1e-07
        "recompute_error_by_block": [float(x) for x in d["recompute_error"]],
    }
