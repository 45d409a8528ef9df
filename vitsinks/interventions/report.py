"""Intervention outputs (docs/interventions.md#outputs): `interventions.csv` (one row per image, head, edit),
`by_head.csv`, `by_class.md`, `summary.json` and `interventions.png` (the aggregation: docs/interventions.md); shards
and their merge. NaN entries are left out of the means; the register controls are averaged over the inputs of the
main scope's blocks and listed block by block in `register_controls`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import matplotlib.pyplot as plt
import numpy as np

from vitsinks.diagnostics.summary import DEFAULT_BLOCK0_POLICY, block0_apart, main_blocks
from vitsinks.interventions.edits import DONOR_EDITS, EDITS, REGISTER_EDITS, SHUFFLE_EDITS
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue, InputNotFound
from vitsinks.utils.generations import Kind, generation
from vitsinks.utils.plotting import CLASS_COLORS, CLASS_LABELS, empty_note, log_axis, save_figure
from vitsinks.utils.results import RESULTS, Column, Result
from vitsinks.utils.rundir import CONFIG, SOURCE, SUMMARY, RunDir
from vitsinks.utils.stats import nan_mean_std
from vitsinks.utils.tables import markdown_table, write_csv

ROW_FIELDS = ("image", "image_index", "block", "head", "edit", "donor_index", "random_token", "event_class", "sink_idx",
              "sink_loc", "final_patch_relrms", "coherence", "donor_cosine", "probe_agree", "probe_kl", "probe_ce",
              "probe_correct", "probe_ce_base", "probe_correct_base")
METRICS = ("final_patch_relrms", "coherence", "donor_cosine", "probe_agree", "probe_kl", "probe_ce_delta",
           "probe_top1_delta")
CLASS_ORDER = ("nop", "broadcast", "other", "none", "model")
EDIT_ORDER = {e: i for i, e in enumerate(EDITS)}
INT_FIELDS = ("image", "image_index", "block", "head", "donor_index", "random_token", "sink_idx")
SHARDS = "shards"  # beside the outputs: the shards' rows, written before their merge
# The outputs are one generation (`utils.generations`); `legacy`: the names written before the record (a fixed list)
INTERVENTIONS = Kind("interventions report", marks=("interventions.csv",), keep=(SOURCE, SHARDS), last=SUMMARY,
                     legacy=("interventions.csv", "by_head.csv", "by_class.md", SUMMARY, "interventions.png", CONFIG))


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """The rows as CSV (empty cells for metrics a row does not have), written atomically."""
    write_csv(path, ROW_FIELDS, ({k: ("" if isinstance(r.get(k), float) and math.isnan(r[k]) else r.get(k, ""))
                                  for k in ROW_FIELDS} for r in rows))


def read_rows(path: Path, rerun: str = "rerun the interventions (`python -m vitsinks.intervene`)"
              ) -> list[dict[str, Any]]:
    """Rows written by `write_rows`, numbers parsed (empty cells: absent); torn: a `BadFile` whose fix is `rerun`."""
    out = []
    for r in files.read_csv(path, rerun, needs=("edit",)):
        row: dict[str, Any] = {}
        for k, v in r.items():
            if v == "":
                continue
            try:
                row[k] = int(v) if k in INT_FIELDS else v if k in ("edit", "event_class", "sink_loc") else float(v)
            except ValueError as err:
                raise files.BadFile(f"{path} is torn or is not the table vitsinks writes ({k}={v!r} is not a "
                                    f"number): {rerun} to write it again") from err
        out.append(row)
    return out


def _metric(r: dict[str, Any], key: str) -> float:
    if key == "probe_ce_delta":
        return r["probe_ce"] - r["probe_ce_base"] if "probe_ce" in r else math.nan
    if key == "probe_top1_delta":
        return r["probe_correct"] - r["probe_correct_base"] if "probe_correct" in r else math.nan
    return r.get(key, math.nan)


def by_head(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (block, head, edit, event class): the number of images and the mean of every metric over them."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["block"], r["head"], r["edit"], r["event_class"])].append(r)
    keys = sorted(groups, key=lambda k: (k[0], k[1], EDIT_ORDER.get(k[2], 99), CLASS_ORDER.index(k[3])))
    return [{"block": b, "head": h, "edit": e, "event_class": c, "n": len(groups[(b, h, e, c)]),
             **{m: nan_mean_std(_metric(r, m) for r in groups[(b, h, e, c)])[0] for m in METRICS}}
            for b, h, e, c in keys]


ScopeKind = Literal["main", "block0", "model"]
MODEL_SCOPE, BLOCK0_SCOPE = "whole model", "block 0"  # the scope names in by_class.md and summary.json


def scope_of(block: int, n_blocks: int, policy: str = DEFAULT_BLOCK0_POLICY) -> str:
    """The scope a head of `block` is reported in (-1: the whole-model edits) under the block-0 `policy`."""
    if block < 0:
        return MODEL_SCOPE
    if block not in main_blocks(n_blocks, policy):
        return BLOCK0_SCOPE
    return "blocks 1..L-1" if block0_apart(n_blocks, policy) else "block 0 (only)"


def unit_label(block: int, head: int) -> str:
    """A by_class cell's entry: `block:head`, `<block>:in` (a register control there) or `all` (the whole model)."""
    if block < 0:
        return "all"
    return f"{block}:in" if head < 0 else f"{block}:{head}"


def scope_kind(name: str) -> ScopeKind:
    """Which scope a name of `scope_of` is: the main one, block 0 reported apart, or the whole model."""
    return "model" if name == MODEL_SCOPE else "block0" if name == BLOCK0_SCOPE else "main"


def by_class(head_rows: list[dict[str, Any]], min_class_events: int, n_blocks: int,
             policy: str = DEFAULT_BLOCK0_POLICY) -> dict[str, Any]:
    """{scope: {class: {edit: {n_heads, heads, <metric>, <metric>_std}}}} over heads with enough events."""
    out: dict[str, Any] = {}
    for cls in ("nop", "broadcast", "model"):
        for r in head_rows:
            if r["event_class"] != cls or (cls != "model" and r["n"] < min_class_events):
                continue
            if r["head"] < 0 <= r["block"] and r["block"] not in main_blocks(n_blocks, policy):
                continue  # a register control at block 0's input: in the per-block table only
            scope = MODEL_SCOPE if r["head"] < 0 else scope_of(r["block"], n_blocks, policy)
            cell = out.setdefault(scope, {}).setdefault(cls, {}).setdefault(
                r["edit"], {"heads": [], "_vals": defaultdict(list)})
            cell["heads"].append(unit_label(r["block"], r["head"]))
            for m in METRICS:
                cell["_vals"][m].append(r[m])
    for scope in out.values():
        for edits in scope.values():
            for cell in edits.values():
                vals = cell.pop("_vals")
                cell["n_heads"] = len(cell["heads"])
                for m in METRICS:
                    cell[m], cell[f"{m}_std"], _ = nan_mean_std(vals[m])
    return out


def register_controls(head_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (register control, block input) the images and the metrics' means, in EDITS then block order."""
    rows = [r for r in head_rows if r["edit"] in REGISTER_EDITS]
    return [{"block": r["block"], "edit": r["edit"], "n": r["n"], **{m: r[m] for m in METRICS}}
            for r in sorted(rows, key=lambda r: (EDIT_ORDER[r["edit"]], r["block"]))]


def _fmt(x: float, digits: int = 4) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{x:.2e}" if 0 < abs(x) < 10 ** -(digits - 1) else f"{x:.{digits}f}"


def to_markdown(summary: dict[str, Any]) -> str:
    """by_class.md: one table per scope, a row per (class, edit)."""
    lines = [f"# Interventions: {summary['subject']}", "",
             f"{summary['n_images']} images, heads {', '.join(summary['selected']) or '-'}; edits: "
             f"{', '.join(summary['edits'])}. Mean over a head's events of the class, then over heads with >= "
             f"{summary['min_class_events']} such events (std over heads). Final patch rel. RMS change excludes the "
             "sink token.", ""]
    if "protocol" in summary:
        p, im = summary["protocol"], summary["images"]
        source = f"image list {p['image_list']}" if p.get("image_list") else (
            f"permutation seed {p['seed']}" if p["order"] == "permuted" else "the split's own order")
        lines += [f"Protocol {p['name']}: images in the order of the {source}, the first {im['edited']} edited, the "
                  f"next {im['heldout']} held out (disjoint); batches of {im['batch_size']}, random patches seeded "
                  f"{im['random_seed']} + 1000 * shard (vitsinks' noise and shuffle controls: + 500).", ""]
    skipped = summary.get("mean_sink_value_skipped") or {}
    if skipped:
        why = sorted(set(skipped.values()))
        lines += [f"mean_sink_value skipped for heads {', '.join(skipped)} ({'; '.join(why)}).", ""]
    if "donor_cosine_form" in summary and any(e in DONOR_EDITS + SHUFFLE_EDITS for e in summary["edits"]):
        lines += [f"donor_cosine: the donor direction (the donor's mean final patch - the image's own), its means "
                  f"over the patches: {summary['donor_cosine_form']}.", ""]
    ch = summary["checks"]
    if ch.get("rows_not_applicable"):
        lines += ["Rows not written (a sink, or a donor's sink, on an extra key whose value the edit cannot change: a "
                  "null key's 0, an attention bias): " + ", ".join(f"{e} {n}" for e, n in
                                                                  ch["rows_not_applicable"].items()) + ".", ""]
    if ch.get("redirect_ref_rows"):
        lines += [f"redirect_sink_attention_ref (the reference's formula: A's sink column zeroed, rows divided by "
                  f"their sum clamped at {ch['redirect_ref_clamp']:g}): {ch['redirect_ref_rows_clamped']} of "
                  f"{ch['redirect_ref_rows']} rows fell below the clamp (switched off rather than redirected); "
                  "redirect_sink_attention is the exact redirect from the scores.", ""]
    if summary.get("mean_registers_source"):
        lines += [f"mean_registers: the register tokens' mean at each block input over "
                  f"{summary['mean_registers_source']}.", ""]
    shown = [m for m in METRICS if any(not math.isnan(c.get(m, math.nan)) for s in summary["by_class"].values()
                                       for e in s.values() for c in e.values())]
    for scope, classes in summary["by_class"].items():
        cells = [(cls, edit, c) for cls in CLASS_ORDER for edit in EDITS
                 if (c := classes.get(cls, {}).get(edit)) is not None]
        lines += [f"## {scope}", "", *markdown_table(
            ["class", "edit", "heads", *shown],
            [[cls, edit, c["n_heads"], *(_fmt(c[m]) + ("" if math.isnan(c[f"{m}_std"]) else
                                                       f" ± {_fmt(c[f'{m}_std'])}") for m in shown)]
             for cls, edit, c in cells]), ""]
    if not summary["by_class"]:
        lines += ["No head has enough events of a class to be averaged (see by_head.csv).", ""]
    per_block = summary.get("register_controls") or []
    if per_block:
        cols = [m for m in METRICS if any(not math.isnan(r[m]) for r in per_block)]
        lines += ["## register controls by block input", "",
                  "The register tokens entering block b set to 0, to their held-out mean there, or to another "
                  "image's (a seeded derangement), blocks b.. run; mean over the images.", "",
                  *markdown_table(["block", "edit", "images", *cols],
                                  [[r["block"], r["edit"], r["n"], *(_fmt(r[m]) for m in cols)] for r in per_block]),
                  ""]
    lines += [f"Built-in checks: block recomputation max rel. error {ch['recompute_error_max']} (< "
              f"{ch['recompute_tol']}), {ch['value_edits_checked']} value edits checked in float64, max rel. error "
              f"{ch['value_edit_error_max']} (< {ch['value_edit_tol']})"
              + (f"; the redirect from the scores vs A's own rescaling on the {ch['redirect_rows_checked']} rows "
                 f"that float32 holds off the sink, max rel. error {ch['redirect_error_max']} (< "
                 f"{ch['redirect_tol']})"
                 if ch.get("redirect_rows_checked") else
                 "; the redirect from the scores checked on 0 rows (A predicts none of them: docs/interventions.md"
                 "#built-in-checks)" if summary.get("selected") and "redirect_sink_attention" in summary["edits"]
                 else "") + "."]
    return "\n".join(lines) + "\n"


def figure(head_rows: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> Path:
    """The reference's Figure 6 layout: per edit a bar per class and a dot per head, for three metrics."""
    report = InterventionsReport.from_json(summary)
    cells = {cls: report.classes("main").get(cls, {}) for cls in ("nop", "broadcast")}
    cells["model"] = report.classes("model").get("model", {})
    classes = [c for c in ("nop", "broadcast", "model") if cells[c]]
    edits = [e for e in EDITS if any(e in cells[c] for c in classes)]
    panels = (("final_patch_relrms", "final patch rel. RMS change\n(sink excluded, log)", edits),
              ("coherence", "coherence: share of the change\ncommon to all patches", edits),
              ("donor_cosine", "donor and shuffle edits: cosine\nof the change to (donor - own)",
               [e for e in edits if e in DONOR_EDITS + SHUFFLE_EDITS]))
    fig, axes = plt.subplots(1, 3, figsize=(max(15.0, 1.3 * len(edits) + 11), 4.8),
                             gridspec_kw={"width_ratios": [max(2, len(edits)), max(2, len(edits)),
                                                           max(2, len(panels[2][2]))]})
    width = 0.8 / max(len(classes), 1)
    for ax, (metric, title, names) in zip(axes, panels, strict=True):
        x = np.arange(len(names))
        for i, cls in enumerate(classes):
            shown = False
            for j, e in enumerate(names):
                c = cells[cls].get(e)
                if c is None or math.isnan(c[metric]):
                    continue
                pos = x[j] + (i - (len(classes) - 1) / 2) * width
                ax.bar(pos, c[metric], width, color=CLASS_COLORS[cls], alpha=0.75,
                       label=None if shown else CLASS_LABELS[cls])
                shown = True
                heads = {unit_label(r["block"], r["head"]): r[metric] for r in head_rows
                         if r["edit"] == e and r["event_class"] == cls}
                dots = [heads[h] for h in c["heads"] if h in heads and not math.isnan(heads[h])]
                ax.plot(np.full(len(dots), pos), dots, "o", color="black", ms=3)
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        if metric == "final_patch_relrms":
            log_axis(ax, [p.get_height() for p in ax.patches] + [y for ln in ax.lines for y in ln.get_ydata()])
        else:
            ax.set_ylim(-1.05 if metric == "donor_cosine" else 0, 1.05)
            ax.axhline(0, color="black", lw=0.5)
        if ax.get_legend_handles_labels()[0]:
            if ax is axes[0]:  # one legend: the colours are the same in every panel
                ax.legend(fontsize=8, title="what was edited", title_fontsize=8)
        else:
            empty_note(ax, "no donor or shuffle edit in this report" if metric == "donor_cosine" and not names else
                       f"no head with >= {summary['min_class_events']} events of a class and no register edit"
                       if not names else "no value to show (NaN)")
    return save_figure(fig, path, f"interventions on {summary['subject']} ({summary['n_images']} images; bar: mean "
                                  f"over heads, dot: one head)")


def block0_policy(meta: dict[str, Any]) -> str:
    """The block-0 policy a report's heads were selected by (its `rule`; absent: the default)."""
    return str((meta.get("rule") or {}).get("block0_policy", DEFAULT_BLOCK0_POLICY))


def write_outputs(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any], config: str | None = None
                  ) -> dict[str, Any]:
    """Every output file (and `config` as config.yaml) into `out` as one generation; returns the summary."""
    with generation(out, INTERVENTIONS) as stage:
        heads = by_head(rows)
        per_block = register_controls(heads)
        report = InterventionsReport.from_json({**meta, **({"register_controls": per_block} if per_block else {}),
                                                "by_class": by_class(heads, meta["min_class_events"],
                                                                     meta["n_blocks"], block0_policy(meta))})
        summary = report.to_json()
        write_rows(rows, stage / "interventions.csv")
        write_csv(stage / "by_head.csv", ["block", "head", "edit", "event_class", "n", *METRICS], heads)
        files.write_text(stage / "by_class.md", to_markdown(summary))
        files.write_json(stage / SUMMARY, summary)
        figure(heads, summary, stage / "interventions.png")
        if config is not None:
            files.write_text(stage / CONFIG, config)
    return summary


def write_shard(out: Path, shard: int, nshards: int, rows: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """A shard's rows and metadata under `out/shards/<shard>-of-<nshards>/`."""
    folder = out / SHARDS / f"{shard}-of-{nshards}"
    folder.mkdir(parents=True, exist_ok=True)
    write_rows(rows, folder / "rows.csv")
    files.write_json(folder / "meta.json", meta)
    return folder


def merge(out: Path) -> dict[str, Any]:
    """Join the shards under `out/shards/` into the final outputs; every shard of one run must be present."""
    metas = {p.parent: files.read_json(p, f"rerun the shard {p.parent.name} (shard=k nshards=n)")
             for p in sorted((out / SHARDS).glob("*-of-*/meta.json"))}
    if not metas:
        raise InputNotFound(f"no shards under {out / 'shards'}: run with shard=k nshards=n first")
    keys = {m["key"] for m in metas.values()}
    if len(keys) > 1:
        raise BadValue(f"the shards under {out / 'shards'} come from different settings or checkpoints: delete the "
                         f"stale ones and rerun them")
    n = next(iter(metas.values()))["nshards"]
    have = {m["shard"] for m in metas.values() if m["nshards"] == n}
    missing = sorted(set(range(n)) - have)
    if missing or len(metas) != n:
        raise BadValue(f"shards {missing or 'of another nshards'} of {n} are missing or extra under {out / 'shards'}:"
                         f" run the missing ones (shard=k nshards={n}) before merging")
    ordered = sorted(metas.items(), key=lambda kv: kv[1]["shard"])
    rows = [r for folder, _ in ordered for r in read_rows(folder / "rows.csv", f"rerun the shard {folder.name}")]
    meta = dict(ordered[0][1])
    for k in ("shard", "nshards", "heads"):
        meta.pop(k, None)
    meta["mean_source"] = {k: v for _, m in ordered for k, v in m["mean_source"].items()}
    meta["mean_sink_value_skipped"] = {k: v for _, m in ordered for k, v in m.get("mean_sink_value_skipped",
                                                                                    {}).items()}
    meta["checks"] = _merge_checks([m["checks"] for _, m in ordered])
    meta["merged_shards"] = n
    config = ordered[0][0] / CONFIG  # the shards' settings (shard 0's copy)
    return write_outputs(out, rows, meta, config.read_text() if config.is_file() else None)


def _merge_checks(checks: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(checks[0])
    for key in ("recompute_error_max", "value_edit_error_max", "redirect_error_max"):
        out[key] = f"{max(float(c.get(key, 0)) for c in checks):.3e}"
    for key in ("value_edits_checked", "redirect_rows_checked", "redirect_ref_rows", "redirect_ref_rows_clamped"):
        out[key] = sum(c.get(key, 0) for c in checks)
    skipped: Counter[str] = Counter()
    for c in checks:
        skipped.update(c.get("rows_not_applicable", {}))
    if skipped:
        out["rows_not_applicable"] = dict(skipped)
    return out


# --- the typed result and its leaderboard columns --------------------------------------------------------------
# key, label, event class, edit: the mean final-patch rel. RMS change per (class, edit), main scope or whole model
CAUSAL = (("causal_zero_nop", "zero v_s, NOP heads (rel. change)", "nop", "zero_sink_value"),
          ("causal_redirect_nop", "redirect, NOP heads", "nop", "redirect_sink_attention"),
          ("causal_zero_broadcast", "zero v_s, broadcast heads", "broadcast", "zero_sink_value"),
          ("causal_drop_registers", "drop registers", "model", "drop_registers"))


@dataclass
class Scope:
    """One scope of the report: its name (as in by_class.md), which scope it is, {class: {edit: cell}}."""

    name: str
    kind: ScopeKind
    classes: dict[str, dict[str, dict[str, Any]]]


@RESULTS.register
@dataclass
class InterventionsReport(Result):
    """`interventions/<checkpoint>/summary.json`: the settings and checks (`meta`) and the per-scope means."""

    kind = "interventions"
    rank = 70

    scopes: list[Scope]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.meta, "by_class": {s.name: s.classes for s in self.scopes}}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> InterventionsReport:
        return cls([Scope(name, scope_kind(name), classes) for name, classes in obj["by_class"].items()],
                   {k: v for k, v in obj.items() if k != "by_class"})

    def classes(self, kind: ScopeKind) -> dict[str, dict[str, dict[str, Any]]]:
        """{class: {edit: cell}} of the first scope of `kind` ({} without one)."""
        return next((s.classes for s in self.scopes if s.kind == kind), {})

    @classmethod
    def columns(cls) -> list[Column]:
        return [Column(k, label, "causal", fmt="g", higher_is_better=None) for k, label, _, _ in CAUSAL]

    @classmethod
    def collect(cls, run: RunDir) -> dict[str, Any]:
        """The causal columns from the run's report of `last.pt`, else its newest one."""
        path = run.latest_interventions()
        out = cls.missing()
        if path is None:
            return out
        report = cls.from_json(files.read_json(path, f"rerun `python -m vitsinks.intervene "
                                                     f"ckpt={run.checkpoint(path.parent.name)}`"))
        for key, _, event_class, edit in CAUSAL:
            cell = report.classes("model" if event_class == "model" else "main").get(event_class, {}).get(edit)
            if cell is not None:
                out[key] = cell["final_patch_relrms"]
        return out
