"""Sink locations, the per-checkpoint summary and its typed result (`DiagnosticsSummary`, with its leaderboard
columns); events and classes come from `vitsinks.diagnostics.rules`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics.head_shape import shape_summary
from vitsinks.diagnostics.persistence import MASSIVE_K, emergence_summary, lifetime_summary, massive_emergence
from vitsinks.diagnostics.residual import (
    check_ks,
    entering_norms,
    high_norm_stats,
    k_key,
    norm_histogram,
    norm_quantiles,
    sink_tokens,
    top_activation_stats,
)
from vitsinks.diagnostics.rules import (  # noqa: F401 - re-exported: the rules' home is diagnostics.rules
    BROADCAST_MAX_RANK,
    BROADCAST_MIN,
    CLASSES,
    DEFAULT_BLOCK0_POLICY,
    NOP_MAX,
    ROUTED_MIN,
    SinkRules,
    check_block0_policy,
    classify,
    events,
)
from vitsinks.models.common_mode import common_mode_ratio
from vitsinks.models.layout import TOKEN_LOCATIONS, KeyLayout
from vitsinks.models.mitigations import MITIGATIONS
from vitsinks.utils import files
from vitsinks.utils.results import RESULTS, Column, Result
from vitsinks.utils.rundir import RunDir

LOCATIONS = TOKEN_LOCATIONS  # the tokens' locations; a layout with extra key slots has more (`KeyLayout.locations`)


def layout_of(d: dict[str, np.ndarray]) -> KeyLayout:
    """The key layout of a diagnosis (its `num_registers`, patches and extra key slots)."""
    return KeyLayout.from_fields(d, n_tokens=d["res_norm"].shape[-1] if "res_norm" in d else None)


def token_location(index: np.ndarray, num_registers: int, num_cls: int = 1) -> np.ndarray:
    """Where token indices sit: 0 [CLS] (or a sequence's first token), 1 register, 2 patch; without a [CLS]
    (`num_cls` 0) the registers come first and no index is code 0."""
    return KeyLayout(num_registers, 0, cls=num_cls).location_code(index)


def location(d: dict[str, np.ndarray]) -> np.ndarray:
    """Where each dominant key sits: codes into the layout's `locations` ([CLS], register, patch, extra slots)."""
    return layout_of(d).location_code(d["sink_idx"])


def _fmt(x: float) -> float:
    return float(np.round(x, 6))


def sinks_per_image(ev: np.ndarray, cls: np.ndarray, loc: np.ndarray,
                    locations: Sequence[str] = LOCATIONS) -> dict[str, dict[str, float]]:
    """Events summed over heads and blocks, averaged over images, by class x location (`loc`: `locations` codes)."""
    out: dict[str, dict[str, float]] = {}
    for ci, cname in enumerate((*CLASSES, "all")):
        row = {}
        for li, lname in enumerate((*locations, "all")):
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


def block0_apart(n_blocks: int, policy: str = DEFAULT_BLOCK0_POLICY) -> bool:
    """The block-0 rule, the one place it is decided: block 0 is counted apart from blocks 1..L-1 in a model with more
    than one block, and in a one-block model too under `always_apart` (the reference's; its main scope is empty)."""
    return n_blocks > 1 or check_block0_policy(policy) == "always_apart"


def main_blocks(n_blocks: int, policy: str = DEFAULT_BLOCK0_POLICY) -> range:
    """The blocks of the main scope: 1..L-1, or the only block of a one-block model (see `block0_apart`)."""
    return range(1 if block0_apart(n_blocks, policy) else 0, n_blocks)


def scored_blocks(n_blocks: int, block0: bool = False, policy: str = DEFAULT_BLOCK0_POLICY) -> slice:
    """The blocks that sinks per image count: the main scope (`main_blocks`), every block with `block0`."""
    return slice(0 if block0 else main_blocks(n_blocks, policy).start, None)


def blocks_label(n_blocks: int, block0: bool = False, policy: str = DEFAULT_BLOCK0_POLICY) -> str:
    """How `scored_blocks` reads in a summary or a table header."""
    if block0:
        return "0 (the only block)" if n_blocks == 1 else "0..L-1"
    if not block0_apart(n_blocks, policy):
        return "0 (the only block)"
    return "1..L-1 (none: block 0 is the only block)" if n_blocks == 1 else "1..L-1"


def rule_record(rules: SinkRules, n_blocks: int, block0: bool = False) -> dict[str, Any]:
    """The settings a sink count was made with, as stored in summary.json (`rule`) and read by the leaderboard."""
    return {**rules.record(), "blocks_counted": blocks_label(n_blocks, block0, rules.block0_policy)}


def describe_rule(r: dict[str, Any] | None) -> str:
    """One readable line for a `rule_record` (None: a summary written before the rule was recorded)."""
    if not r:
        return "rule not recorded (a summary older than the rule record)"
    events_ = (f"relaxed rule (routed_frac >= {ROUTED_MIN:g})" if r["events"] == "relaxed"
               else f"Definition 1 (min_a >= 1 - eps, eps {r['eps']:g})")
    rank = f" and stable rank <= {BROADCAST_MAX_RANK:g}" if r["use_stable_rank"] else ", no stable-rank test"
    return (f"{events_}; NOP-like {r['ratio']} <= {NOP_MAX:g}, broadcast-like {r['ratio']} >= {BROADCAST_MIN:g}"
            f"{rank}; blocks {r['blocks_counted']}")


def strongest_heads(d: dict[str, np.ndarray], ratio: str = "ratio_out") -> dict[str, list]:
    """Per block, the head with the largest mean `mass` over images among those that attend to something (not `dead`
    in every image): its index, that mass, where its dominant key sits most often ("dead" where every head of the
    block attends to nothing), the median value `ratio` of that key, and its mean `prefix_mass` (docs/sinks.md)."""
    mean_mass = d["mass"].mean(axis=0)  # (L, H)
    all_dead = d["dead"].min(axis=0).astype(bool) if "dead" in d else np.zeros(mean_mass.shape, dtype=bool)
    heads = np.where(all_dead, -np.inf, mean_mass).argmax(axis=1)
    blocks = np.arange(len(heads))
    loc = location(d)[:, blocks, heads]  # (images, L)
    names = layout_of(d).locations
    out = {
        "head": heads.tolist(),
        "mass": [_fmt(x) for x in mean_mass[blocks, heads]],
        "location": ["dead" if all_dead[b].all() else names[int(np.bincount(loc[:, b], minlength=len(names)).argmax())]
                     for b in blocks],
        "ratio": [_fmt(x) for x in np.nanmedian(d[ratio][:, blocks, heads], axis=0)],
    }
    if "prefix_mass" in d:
        out["prefix_mass"] = [_fmt(x) for x in d["prefix_mass"].mean(axis=0)[blocks, heads]]
    return out


def continuous_measures(d: dict[str, np.ndarray], rules: SinkRules | None = None) -> dict[str, Any]:
    """Measures that move before any sink event: the strongest head per block, the share of (image, head) pairs
    with mass >= 0.3 and Definition-1 sinks per image at several eps (by `rules`' class)."""
    rules = rules or SinkRules()
    cls = rules.classify(d)
    blocks = scored_blocks(d["mass"].shape[1], policy=rules.block0_policy)
    strong = d["mass"] >= MASS_SHARE_MIN
    def1 = {}
    for eps in DEF1_EPS:
        ev = events(d, "def1", eps)[:, blocks]
        def1[str(eps)] = {"all": _fmt(ev.sum(axis=(1, 2)).mean()),
                          **{name: _fmt((ev & (cls[:, blocks] == i)).sum(axis=(1, 2)).mean())
                             for i, name in enumerate(CLASSES[:2])}}
    return {"strongest_head_by_block": strongest_heads(d, rules.ratio),
            "mass_share_by_block": [_fmt(x) for x in strong.mean(axis=(0, 2))], "mass_share": _fmt(strong.mean()),
            "def1_sinks_per_image": def1}


def update_measures(d: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per block: the common-mode penalty of the attention update over the diagnosed images (docs/fidelity.md)."""
    out: dict[str, Any] = {}
    if "cm_num" in d:
        ratio = common_mode_ratio(d["cm_num"].mean(0), d["cm_den"].mean(0))  # of the means over the images
        out["common_mode_by_block"] = [_fmt(x) for x in ratio]
    return out


def mitigation_measures(d: dict[str, np.ndarray]) -> dict[str, Any]:
    """Each registered mitigation's part of the summary (`summarise`) where the diagnosis holds its fields."""
    layout, out = layout_of(d), {}
    for m in MITIGATIONS.values():
        if any(k in d for k in m.diagnostic_fields):
            out.update(m.summarise(d, layout))
    return out


def depth_measures(d: dict[str, np.ndarray], ev: np.ndarray) -> dict[str, Any]:
    """summary.json's `head_shape`, `sink_lifetime` (of the events `ev`) and `massive_emergence` (docs/sinks.md),
    each where the diagnosis holds its arrays."""
    layout = layout_of(d)
    keys = np.arange(layout.n_keys)
    out: dict[str, Any] = {}
    if "concentration" in d:
        out["head_shape"] = shape_summary(d)
    out["sink_lifetime"] = lifetime_summary(d["sink_idx"], ev, layout.n_keys, layout.locations,
                                            layout.location_code(keys))
    if "massive_new" in d or "res_norm" in d:
        m = d if "massive_new" in d else massive_emergence(d["res_norm"])
        out["massive_emergence"] = emergence_summary(m["massive_new"], m["massive_cv"])
    return out


def _opt(x: float) -> float | None:
    return None if math.isnan(x) else _fmt(x)


def residual_measures(d: dict[str, np.ndarray], rules: SinkRules | None = None,
                      high_norm_k: Sequence[float] = tuple(DiagnosticsConfig().high_norm_k)) -> dict[str, Any]:
    """summary.json's `residual` (docs/residual.md) from a diagnosis' `res_*` arrays: per block the token-norm
    quantiles and histogram, the high-norm tokens at each threshold of `high_norm_k` and the largest activations."""
    rules = rules or SinkRules()
    norms = d["res_norm"].astype(np.float64)  # float32 rounds to noisy decimals in JSON
    layout = layout_of(d)
    token_loc = layout.location_code(np.arange(norms.shape[2]))  # the residual side: tokens only
    is_sink = sink_tokens(d["sink_idx"], rules.events(d), norms.shape[2])
    entering = entering_norms(norms, d["res_norm_in"].astype(np.float64) if "res_norm_in" in d else None)
    edges, counts = norm_histogram(norms)
    high = {}
    for k in check_ks(high_norm_k):
        hn = high_norm_stats(norms, k, token_loc, is_sink, entering, len(LOCATIONS))
        high[k_key(k)] = {
            "per_image_by_block": [_fmt(x) for x in hn["per_image"]],
            "location_by_block": {name: [_fmt(x) for x in hn["by_location"][i]] for i, name in enumerate(LOCATIONS)},
            "sink_share_by_block": [_opt(x) for x in hn["sink_share"]],
        }
    top = top_activation_stats(d["res_top"].astype(np.float64), d["res_abs_median"].astype(np.float64),
                               d["res_top_channel"], layout.location_code(d["res_top_token"]))
    return {
        "sink_share_of": SINK_SHARE_OF,
        "norm_quantiles_by_block": {name: [_fmt(x) for x in q] for name, q in norm_quantiles(norms).items()},
        "norm_hist": {"edges": [float(x) for x in edges], "counts_by_block": counts.astype(int).tolist()},
        "high_norm": high,
        "top_activations": {
            "top_by_block": [[_fmt(x) for x in row] for row in top["top"]],
            "median_by_block": [_fmt(x) for x in top["median"]],
            "ratio_by_block": [_fmt(x) if math.isfinite(x) else None for x in top["ratio"]],
            "channel_by_block": [int(x) for x in top["channel"]],
            "location_by_block": [LOCATIONS[int(x)] for x in top["location"]],
        },
    }


def summarize(d: dict[str, np.ndarray], rules: SinkRules | None = None, residual: bool = DiagnosticsConfig().residual,
              high_norm_k: Sequence[float] = tuple(DiagnosticsConfig().high_norm_k)) -> dict[str, Any]:
    """The JSON summary of one diagnosed checkpoint (docs/sinks.md), events and classes read by `rules` (default: the
    `diagnostics` defaults); with `residual` (and the `res_*` arrays) also `residual` (`residual_measures`)."""
    rules = rules or SinkRules()
    ev, cls, loc = rules.events(d), rules.classify(d), location(d)
    layout = layout_of(d)
    names = layout.locations
    n_img, n_blocks, n_heads = ev.shape
    blocks = scored_blocks(n_blocks, policy=rules.block0_policy)
    massive_loc = layout.location_code(d["massive_token"])
    sink_heads = ev.any(axis=0)
    return {
        "rule": rule_record(rules, n_blocks),
        "shape": {"images": n_img, "blocks": n_blocks, "heads": n_heads,
                  "registers": int(d["num_registers"])},
        "sinks_per_image": sinks_per_image(ev[:, blocks], cls[:, blocks], loc[:, blocks], names),
        "sinks_per_image_block0": sinks_per_image(ev[:, :1], cls[:, :1], loc[:, :1], names),
        "block_frequency": [_fmt(x) for x in ev.mean(axis=(0, 2))],
        "max_mass_by_block": [_fmt(x) for x in d["mass"].max(axis=2).mean(axis=0)],  # strongest head, per image
        "head_frequency": [[_fmt(x) for x in row] for row in ev.mean(axis=0)],
        "location_by_block": {name: [_fmt(x) for x in ((loc == i) & ev).sum(axis=2).mean(axis=0)]
                              for i, name in enumerate(names)},
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
        **({"residual": residual_measures(d, rules, high_norm_k)} if residual and "res_norm" in d else {}),
        **continuous_measures(d, rules),
        **depth_measures(d, ev),
        **mitigation_measures(d),
        **update_measures(d),
        "recompute_error_max": float(np.max(d["recompute_error"])),  # unrounded: JSON writes 3.1e-07
        "recompute_error_by_block": [float(x) for x in d["recompute_error"]],
    }


# --- the typed result and its leaderboard columns --------------------------------------------------------------
_SPI = (("sinks", "sinks / image", "all", "all"), ("nop", "NOP-like", "nop", "all"),
        ("broadcast", "broadcast-like", "broadcast", "all"), ("on_cls", "on [CLS]", "all", "cls"),
        ("on_register", "on register", "all", "register"), ("on_patch", "on patch", "all", "patch"))
HIGH_NORM_COLUMN_K = MASSIVE_K  # the threshold of the high-norm leaderboard columns (and of a massive token)
# residual.sink_share_of: which tokens a block's sink share counts. Summaries without it (older ones) counted the
# block's own output, which its attention never sees; the leaderboard shows no share for them.
SINK_SHARE_OF = "entering"
_RESIDUAL = (("high_norm", f"high-norm tok. / image ({HIGH_NORM_COLUMN_K:g}x)", "g"),
             ("high_norm_sinks", "share entering a block that are its sinks", "f"),
             ("top_act", "top act. / median", "g"),
             ("reg_share", "reg. neurons' share of outlier norm", "f"))
_STRONGEST = (("max_mass", "strongest head mass"), ("prefix_mass", "its mass on [CLS]+reg"),
              ("strong_ratio", "its value ratio"), ("mass_share", "share mass >= 0.3"))
# (key, label, section, format) of the columns of `head_shape`, `sink_lifetime` and `massive_emergence`
_DEPTH = (("concentration", "max / median key attention", "mechanism", "g"),
          ("diag_mass", "attention on itself", "mechanism", "f"), ("head_util", "head utilisation", "mechanism", "f"),
          ("dead", "heads attending to nothing", "mechanism", "f"),
          ("neg_mass", "negative attention share", "mechanism", "f"),
          ("sink_keys", "sink keys / image", "sinks", "f"), ("sink_span", "sink lifetime (blocks)", "sinks", "f"),
          ("massive_first", "first massive block", "residual", "f"),
          ("massive_cv", "massive norm CV afterwards", "residual", "g"))


@RESULTS.register
@dataclass
class DiagnosticsSummary(Result):
    """`diagnostics/<checkpoint>/summary.json` (written by `run_diagnostics`). Fields an older summary lacks are None
    (left out of its JSON); the mitigations' parts and unknown keys are kept in `extra`."""

    kind = "diagnostics"
    rank = 50

    sinks_per_image: dict[str, dict[str, float]]
    massive_activations: dict[str, Any]
    rule: dict[str, Any] | None = None
    shape: dict[str, int] | None = None
    sinks_per_image_block0: dict[str, dict[str, float]] | None = None
    block_frequency: list[float] | None = None
    max_mass_by_block: list[float] | None = None
    head_frequency: list[list[float]] | None = None
    location_by_block: dict[str, list[float]] | None = None
    class_by_block: dict[str, list[float]] | None = None
    spectrum: dict[str, Any] | None = None
    strongest_head_by_block: dict[str, list] | None = None
    mass_share_by_block: list[float] | None = None
    mass_share: float | None = None
    def1_sinks_per_image: dict[str, dict[str, float]] | None = None
    common_mode_by_block: list[float] | None = None
    recompute_error_max: float | None = None
    recompute_error_by_block: list[float] | None = None
    protocol: str | None = None
    residual: dict[str, Any] | None = None
    head_shape: dict[str, list] | None = None
    sink_lifetime: dict[str, Any] | None = None
    massive_emergence: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _ORDER = ("rule", "shape", "sinks_per_image", "sinks_per_image_block0", "block_frequency", "max_mass_by_block",
              "head_frequency", "location_by_block", "class_by_block", "spectrum", "massive_activations",
              "residual", "strongest_head_by_block", "mass_share_by_block", "mass_share", "def1_sinks_per_image",
              "head_shape", "sink_lifetime", "massive_emergence", "common_mode_by_block", "recompute_error_max",
              "recompute_error_by_block", "protocol")  # the order `summarize` writes them in

    def to_json(self) -> dict[str, Any]:
        """The summary in the order `summarize` writes it (the mitigations' parts, `extra`, before the common-mode
        terms)."""
        typed = [k for k in self._ORDER if getattr(self, k) is not None]
        cut = next((i for i, k in enumerate(typed) if k.startswith(("common_mode", "recompute_error"))), len(typed))
        return {**{k: getattr(self, k) for k in typed[:cut]}, **self.extra,
                **{k: getattr(self, k) for k in typed[cut:]}}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DiagnosticsSummary:
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in obj.items() if k in known},
                   extra={k: v for k, v in obj.items() if k not in known})

    def write(self, path: Path) -> None:
        """Write the summary JSON atomically."""
        files.write_json(path, self.to_json())

    @classmethod
    def load(cls, run: RunDir) -> DiagnosticsSummary | None:
        """The run's newest summary (the final diagnosis, else the newest step's), or None."""
        path = run.latest_summary()
        return None if path is None else cls.from_json(files.read_json(path, run.rediagnose(path.parent.name)))

    @classmethod
    def columns(cls) -> list[Column]:
        return [*(Column(k, label, "mechanism", section="sinks") for k, label, _, _ in _SPI),
                Column("on_extra", "on an extra key", "mechanism", section="sinks",
                       doc="sinks per image on a key that is no token (a null key, an attention bias); only models "
                           "with such keys have a value"),
                *(Column(f"def1_{e}", f"Def.1 eps {e}", "mechanism", section="sinks") for e in DEF1_EPS),
                *(Column(k, label, "mechanism") for k, label in _STRONGEST),
                Column("massive", "max / median token norm", "mechanism", section="residual"),
                Column("common_mode", "attn. common-mode share", "mechanism"),
                *(Column(k, label, "mechanism", fmt, section="residual") for k, label, fmt in _RESIDUAL),
                *(Column(k, label, "mechanism", fmt, section=sec) for k, label, sec, fmt in _DEPTH)]

    @classmethod
    def collect(cls, run: RunDir) -> dict[str, Any]:
        """The columns' values and, for the leaderboard, `sink_rule` (the rule in words), `sink_at` (where the
        strongest sink sits) and `profile` (the strongest head's mass per block)."""
        s = cls.load(run)
        if s is None:
            return {**cls.missing(), "sink_rule": "-", "sink_at": "-", "profile": []}
        spi = s.sinks_per_image
        row: dict[str, Any] = {k: spi[c][loc] for k, _, c, loc in _SPI}
        extra = [loc for loc in spi["all"] if loc not in (*LOCATIONS, "all")]  # the layout's extra key slots
        row["on_extra"] = sum(spi["all"][loc] for loc in extra) if extra else math.nan
        row.update(massive=max(s.massive_activations["ratio_by_block"]), sink_rule=describe_rule(s.rule))
        row.update({k: math.nan for k, _ in _STRONGEST}, common_mode=math.nan,
                   **{f"def1_{e}": math.nan for e in DEF1_EPS}, sink_at="-", profile=[])
        if s.common_mode_by_block:
            row["common_mode"] = float(np.mean(s.common_mode_by_block))
        strong = s.strongest_head_by_block
        if strong:
            b = int(np.argmax(strong["mass"]))  # the block whose strongest head holds the most mass
            row.update(max_mass=strong["mass"][b], strong_ratio=strong["ratio"][b], mass_share=s.mass_share,
                       prefix_mass=strong.get("prefix_mass", [math.nan] * (b + 1))[b],
                       sink_at=f"{strong['location'][b]} (block {b})", profile=list(strong["mass"]),
                       **{f"def1_{e}": v["all"] for e, v in (s.def1_sinks_per_image or {}).items()})
        row.update(residual_columns(s.residual), **shape_columns(s))
        return row


def shape_columns(s: DiagnosticsSummary) -> dict[str, float]:
    """The `_DEPTH` leaderboard columns (docs/evaluation.md) of a summary (NaN where it lacks the part): the largest
    per-block concentration (a null one is inf: a median column sum of 0) and diagonal mass, the mean head
    utilisation, share of dead heads and negative attention share over blocks, the sink keys per image and their
    mean lifetime, the median first massive block and the
    massive tokens' mean coefficient of variation."""
    out = {k: math.nan for k, _, _, _ in _DEPTH}
    if s.head_shape:
        for key, agg, null in (("concentration", max, math.inf), ("diag_mass", max, None),
                               ("head_util", np.mean, None), ("dead", np.mean, None), ("neg_mass", np.mean, None)):
            given = [float(v) if v is not None else null for v in s.head_shape.get(f"{key}_by_block") or []]
            vals = [v for v in given if v is not None]
            out[key] = float(agg(vals)) if vals else math.nan
    if s.sink_lifetime:
        span = s.sink_lifetime["mean_span"]
        out.update(sink_keys=s.sink_lifetime["keys_per_image"], sink_span=math.nan if span is None else span)
    if s.massive_emergence:
        out.update({k: math.nan if v is None else float(v) for k, v in (
            ("massive_first", s.massive_emergence["first_block"]), ("massive_cv", s.massive_emergence["cv"]))})
    return out


def residual_columns(r: dict[str, Any] | None) -> dict[str, float]:
    """The residual leaderboard columns (docs/residual.md) of summary.json's `residual` (None: NaN)."""
    out = {k: math.nan for k, _, _ in _RESIDUAL}
    if not r:
        return out
    high = r.get("high_norm", {}).get(k_key(HIGH_NORM_COLUMN_K))
    if high:
        per_image = high["per_image_by_block"]
        entered = 1 + int(np.argmax(per_image[:-1])) if len(per_image) > 1 else 0
        share = high["sink_share_by_block"][entered] if r.get("sink_share_of") == SINK_SHARE_OF else None
        out.update(high_norm=float(max(per_image)), high_norm_sinks=math.nan if share is None else float(share))
    ratios = [math.inf if x is None else x for x in r.get("top_activations", {}).get("ratio_by_block", [])]
    if ratios:
        out["top_act"] = float(max(ratios))
    shares = [b["norm_share"] for b in r.get("register_neurons", {}).get("by_block", [])
              if b.get("norm_share") is not None]
    if shares:
        out["reg_share"] = float(max(shares))
    return out
