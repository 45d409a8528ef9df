"""The leaderboard: every variant's quality and mechanism side by side.

    python -m vitsinks.leaderboard runs=runs/sweeps/sweep-<id>      # a sweep folder or its sweep.json
    python -m vitsinks.leaderboard runs=runs [out=eval/leaderboard]  # every run directory under a folder

Per run: the configuration, the online probe (val top-1), the linear probe, the dense probes (mIoU) and the
diagnostics summary (sinks per image: NOP-like, broadcast-like, on [CLS] / register / patch; massive-activation
ratio). Grouped by variant as mean +- std over seeds. A variant is marked in a quality column only where Welch's
t-test says it beats every other variant there (`significant_best`); the footnotes say which sink rule the
summaries counted with, and the reference's sinks per image appear only beside counts made the reference's way.
Writes leaderboard.{md,csv,html,png} into `out`.
"""

from __future__ import annotations

import csv
import html
import json
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import yaml
from omegaconf import OmegaConf

from vitsinks.configs.cli import parse_args, run_command
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue, ConfigError, InputNotFound
from vitsinks.utils.plotting import save_figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vitsinks.diagnostics.summary import DEF1_EPS, describe_rule  # noqa: E402
from vitsinks.run.sweep import read_manifest  # noqa: E402
from vitsinks.train.tracking import read_metrics  # noqa: E402
from vitsinks.utils.stats import welch_p  # noqa: E402

LEADING = ["base", "gate", "reg", "gate+reg"]  # the four variants of the study first, then the rest by name
# Dense probes by protocol (`eval.dense_protocol`): the file suffix each writes and the name its columns carry.
DENSE_DATA = {"synthetic": "synthetic", "fashion_mnist": "Fashion-MNIST mosaics", "ade20k": "ADE20K", "voc": "VOC"}
DENSE_PROTOCOLS = {"dinov2": ("", "DINOv2-style probe"), "kempner": ("_kempner", "reference probe"),
                   "kempner_cached": ("_kempner_cached", "reference cached probe")}
QUALITY = [("online_top1", "online probe top-1"), ("linear_top1", "linear top-1"),
           *((f"dense_{d}{suffix}", f"{name} mIoU ({label})") for proto, (suffix, label) in DENSE_PROTOCOLS.items()
             for d, name in DENSE_DATA.items()),
           ("task_fit", "task fit (1 - rel. error)")]
# `python -m vitsinks.intervene` summaries: mean final-patch rel. RMS change per (class, edit), main scope
CAUSAL = [("causal_zero_nop", "zero v_s, NOP heads (rel. change)", "nop", "zero_sink_value"),
          ("causal_redirect_nop", "redirect, NOP heads", "nop", "redirect_sink_attention"),
          ("causal_zero_broadcast", "zero v_s, broadcast heads", "broadcast", "zero_sink_value"),
          ("causal_drop_registers", "drop registers", "model", "drop_registers")]
MECHANISM = [("sinks", "sinks / image"), ("nop", "NOP-like"), ("broadcast", "broadcast-like"), ("on_cls", "on [CLS]"),
             ("on_register", "on register"), ("on_patch", "on patch"),
             *((f"def1_{e}", f"Def.1 eps {e}") for e in DEF1_EPS), ("max_mass", "strongest head mass"),
             ("prefix_mass", "its mass on [CLS]+reg"), ("strong_ratio", "its value ratio"),
             ("mass_share", "share mass >= 0.3"), ("gate_mean", "mean gate"), ("massive", "massive act. ratio"),
             ("common_mode", "attn. common-mode share"), ("pathway_share", "pathway share of update"),
             *((k, n) for k, n, _, _ in CAUSAL)]

# The Kempner gate x register sweep (ViT-L/16 LeJEPA, 3 seeds; IN-1k is the online probe).
REFERENCE = {
    "columns": ["variant", "IN-1k top-1", "ADE20K mIoU", "VOC mIoU"],
    "rows": [["base", "69.37", "16.59", "43.81"], ["reg", "69.31", "18.71", "49.90"],
             ["gate", "69.52", "18.57", "47.95"], ["gate+reg", "69.36", "19.99", "52.17"],
             ["headwise gate", "69.07", "18.51", "47.62"], ["headwise gate+reg", "69.13", "19.92", "52.41"]],
    "notes": ["IN-1k top-1: the online probe (LayerNorm + Linear on the detached final-norm [CLS]). ADE20K / VOC: "
              "the reference's linear probe at 512 x 512 (eval.dense_protocol=kempner), comparable with the "
              "'(reference probe)' columns only, not with the DINOv2-style ones.",
              "LeJEPA paper, frozen linear IN-1k after 100 epochs: ViT-L 77.1, ViT-H/14 79.",
              "DINOv2 linear dense probes: ADE20K 44.3 / 47.3 / 47.7 mIoU, VOC 81.1 / 82.5 / 82.1 (ViT-S/B/L)."],
}
# The Kempner sink table (LeJEPA ViT-L, epoch-50 checkpoints, 1,984 ADE20K val images at 224 px), counted with
# SINK_REFERENCE_RULE: shown only beside sink counts made the same way.
SINK_REFERENCE = {
    "columns": ["variant", "broadcast-like", "NOP-like", "all sinks", "on [CLS]"],
    "rows": [["base (Baseline)", "0.09", "0.25", "0.45", "0.34"], ["gate (Gating)", "3.80", "0.00", "3.88", "2.02"],
             ["global+pen (Global + Penalty)", "0.04", "0.00", "0.11", "0.11"],
             ["gate+global+pen (Gating + Global + Penalty)", "0.53", "0.03", "0.63", "0.08"]],
}
SINK_REFERENCE_RULE = describe_rule({"events": "relaxed", "eps": 0.5, "ratio": "ratio_head", "use_stable_rank": False,
                                     "blocks_counted": "1..L-1"})
ALPHA, MIN_SEEDS = 0.05, 3  # Welch's test level and the fewest seeds per variant it is run with


def variant_order() -> list[str]:
    """Every variant that has a config (`vitsinks/configs/exp/*.yaml`), the study's four first."""
    from vitsinks.configs.schema import exp_names

    names = exp_names()
    return [v for v in LEADING if v in names] + [v for v in names if v not in LEADING]


def run_dirs(source: str | Path) -> list[Path]:
    """Run directories of a sweep (folder or sweep.json) or every folder with a config.yaml under `source`."""
    src = Path(source)
    if src.name == "sweep.json" or (src / "sweep.json").is_file():
        return [Path(r["run_dir"]) for r in read_manifest(src)["runs"]]
    if not src.is_dir():
        raise InputNotFound(f"runs={src} is neither a run folder nor a sweep")
    found = sorted(p.parent for p in src.glob("*/config.yaml")) or ([src] if (src / "config.yaml").exists() else [])
    if not found:
        raise InputNotFound(f"no run directories (with config.yaml) under {src}")
    return found


def _latest_summary(run: Path) -> dict[str, Any] | None:
    final = run / "diagnostics" / "final" / "summary.json"
    if final.exists():
        return json.loads(final.read_text())
    steps = sorted((run / "diagnostics").glob("step_*/summary.json"))
    return json.loads(steps[-1].read_text()) if steps else None


def _causal(run: Path) -> dict[str, float]:
    """The causal columns from the run's intervention summary (`interventions/last`, else the newest one)."""
    folder = run / "interventions"
    path = folder / "last" / "summary.json"
    if not path.is_file():
        found = sorted(folder.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
        path = found[-1] if found else None
    out = {k: math.nan for k, _, _, _ in CAUSAL}
    if path is None:
        return out
    by_class = json.loads(path.read_text())["by_class"]
    main = next((v for k, v in by_class.items() if k not in ("block 0", "whole model")), {})
    for key, _, cls, edit in CAUSAL:
        cell = (by_class.get("whole model", {}) if cls == "model" else main).get(cls, {}).get(edit)
        if cell is not None:
            out[key] = cell["final_patch_relrms"]
    return out


def collect(run: Path) -> dict[str, Any]:
    """One leaderboard row from a run directory; missing evaluations are NaN."""
    cfg = OmegaConf.load(run / "config.yaml")
    row: dict[str, Any] = {"run": run.name, "variant": cfg.exp, "seed": cfg.seed, "model": cfg.model.size,
                           "data": cfg.data.name}
    metrics = read_metrics(run)
    fit = [m["val/rel_error"] for m in metrics if "val/rel_error" in m]
    row["task_fit"] = 100 * (1 - fit[-1]) if fit else math.nan
    online = [m["val/probe_acc"] for m in metrics if "val/probe_acc" in m]
    row["online_top1"] = 100 * online[-1] if online else math.nan
    lin = run / "results" / "linear.json"
    row["linear_top1"] = json.loads(lin.read_text())["best"]["top1"] if lin.exists() else math.nan
    for proto, (suffix, _) in DENSE_PROTOCOLS.items():
        for name in DENSE_DATA:
            path = run / "results" / f"dense_{name}{suffix}.json"
            res = json.loads(path.read_text()) if path.exists() else None
            if res is not None and res.get("protocol", "dinov2") != proto:
                raise BadValue(f"{path} says it was made by the {res.get('protocol')} dense protocol, not {proto}: "
                               f"rerun python -m vitsinks.eval.dense on that run")
            row[f"dense_{name}{suffix}"] = 100 * res["mIoU"] if res else math.nan
    s = _latest_summary(run)
    if s:
        spi = s["sinks_per_image"]
        row.update(sinks=spi["all"]["all"], nop=spi["nop"]["all"], broadcast=spi["broadcast"]["all"],
                   on_cls=spi["all"]["cls"], on_register=spi["all"]["register"], on_patch=spi["all"]["patch"],
                   massive=max(s["massive_activations"]["ratio_by_block"]), sink_rule=describe_rule(s.get("rule")))
        row.update(_continuous(s))
    else:
        row.update({k: math.nan for k, _ in MECHANISM}, **_continuous({}), sink_rule="-")
    row.update(_causal(run))
    return row


def _continuous(s: dict[str, Any]) -> dict[str, Any]:
    """The measures that move (diagnostics summaries written before they existed get NaN)."""
    out: dict[str, Any] = {k: math.nan for k in ("max_mass", "prefix_mass", "strong_ratio", "mass_share",
                                                 "gate_mean", "common_mode", "pathway_share",
                                                 *(f"def1_{e}" for e in DEF1_EPS))}
    out.update(sink_at="-", profile=[])
    if s.get("common_mode_by_block"):
        out["common_mode"] = float(np.mean(s["common_mode_by_block"]))
    shares = [v for v in s.get("pathway", {}).get("share_by_block", []) if v is not None]
    if shares:
        out["pathway_share"] = float(np.mean(shares))
    strong = s.get("strongest_head_by_block")
    if not strong:
        return out
    b = int(np.argmax(strong["mass"]))  # the block whose strongest head holds the most mass
    out.update(max_mass=strong["mass"][b], strong_ratio=strong["ratio"][b], mass_share=s["mass_share"],
               prefix_mass=strong.get("prefix_mass", [math.nan] * (b + 1))[b],
               sink_at=f"{strong['location'][b]} (block {b})", profile=list(strong["mass"]),
               **{f"def1_{e}": v["all"] for e, v in s["def1_sinks_per_image"].items()})
    if "gate_mean_by_block" in s:
        out["gate_mean"] = float(np.mean(s["gate_mean_by_block"]))
    return out


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (data, variant) (std over n >= 2 seeds; NaN columns stay NaN). With several
    datasets in one leaderboard, a row's name is `<data> / <variant>`."""
    order = {v: i for i, v in enumerate(variant_order())}
    keys = sorted({(r["data"], r["variant"]) for r in rows}, key=lambda k: (k[0], order.get(k[1], 99), k[1]))
    several = len({k[0] for k in keys}) > 1
    out = []
    for data, v in keys:
        group = [r for r in rows if r["variant"] == v and r["data"] == data]
        agg: dict[str, Any] = {"variant": f"{data} / {v}" if several else v, "seeds": len(group), "data": data}
        places = sorted({r.get("sink_at", "-") for r in group})
        agg["sink_at"] = places[0] if len(places) == 1 else " / ".join(places)
        profiles = [r["profile"] for r in group if r.get("profile")]
        agg["profile"] = np.mean(profiles, axis=0).tolist() if profiles else []
        agg["sink_rules"] = sorted({r.get("sink_rule", "-") for r in group} - {"-"})
        agg["n"] = {}
        for key, _ in QUALITY + MECHANISM:
            vals = np.array([r[key] for r in group], dtype=float)
            vals = vals[~np.isnan(vals)]
            agg[key] = (float(vals.mean()) if vals.size else math.nan,
                        float(vals.std(ddof=1)) if vals.size > 1 else math.nan)
            agg["n"][key] = int(vals.size)
        out.append(agg)
    return out


def _beats(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    """`a` is better than `b` in column `key`: a higher mean, not equal as shown, and Welch's p < ALPHA."""
    (ma, sa), (mb, sb) = a[key], b[key]
    if ma <= mb or _cell((ma, math.nan), key) == _cell((mb, math.nan), key):
        return False
    return welch_p(ma, sa, a["n"][key], mb, sb, b["n"][key]) < ALPHA


def significant_best(table: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """Per quality column, the variant better than every other one there by Welch's test (p < ALPHA each time,
    >= MIN_SEEDS seeds per variant), if any; and the names of the columns left unmarked for too few seeds."""
    best, few = {}, []
    for key, name in QUALITY:
        rows = [t for t in table if not math.isnan(t[key][0])]
        if len(rows) < 2:
            continue
        if min(t["n"][key] for t in rows) < MIN_SEEDS:
            few.append(name)
            continue
        best.update((key, t["variant"]) for t in rows if all(_beats(t, o, key) for o in rows if o is not t))
    return best, few


def _mark_note(few: list[str], mark: str = "Bold") -> str:
    """The marking rule in words, and the columns it could not be applied to."""
    note = (f"{mark}: a variant better than every other variant of its quality column by a two-sided Welch t-test "
            f"(unequal variances), p < {ALPHA:g} in each comparison, with >= {MIN_SEEDS} seeds per variant; means "
            f"equal as shown are never marked.")
    if few:
        note += (f" Nothing is marked in {', '.join(few)}: some variant has fewer than {MIN_SEEDS} seeds there, too "
                 f"few for the test.")
    return note


def _rules(table: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each sink rule the runs' summaries counted with -> the variants that used it."""
    out: dict[str, list[str]] = {}
    for t in table:
        for r in t["sink_rules"]:
            out.setdefault(r, []).append(t["variant"])
    return out


def _rule_notes(table: list[dict[str, Any]]) -> list[str]:
    """Which rule the sink columns used, and whether the reference's sinks per image can sit beside them."""
    rules = _rules(table)
    if not rules:
        return ["No diagnostics summaries: no sink counts, and no reference sinks per image."]
    if len(rules) == 1:
        notes = [f"Sink columns counted with: {next(iter(rules))}. Def.1: min_a >= 1 - eps, same blocks."]
    else:
        notes = ["The runs' summaries counted sinks with different rules: "
                 + "; ".join(f"{r} ({', '.join(v)})" for r, v in rules.items()) + "."]
    if not _reference_comparable(table):
        notes.append(f"The reference's sinks per image are left out: the reference counts them with "
                     f"[{SINK_REFERENCE_RULE}], these runs' summaries do not (or do not say), so the numbers would "
                     f"not be comparable; each diagnosed checkpoint's sink_table.md counts the reference's way.")
    return notes


def _reference_comparable(table: list[dict[str, Any]]) -> bool:
    return list(_rules(table)) == [SINK_REFERENCE_RULE]


def _cell(mean_std: tuple[float, float], key: str = "") -> str:
    """`mean ± std` with 2 decimals; the causal columns (relative changes spanning decades) in 2 significant
    digits."""
    m, s = mean_std
    if math.isnan(m):
        return "-"
    fmt = "{:.2g}" if key.startswith("causal_") else "{:.2f}"
    return fmt.format(m) if math.isnan(s) else f"{fmt.format(m)} ± {fmt.format(s)}"


def _columns(table: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Only the columns some variant has a value for."""
    return [(k, n) for k, n in QUALITY + MECHANISM if any(not math.isnan(t[k][0]) for t in table)]


SINK_REFERENCE_TITLE = (f"Reference sinks per image (Kempner, LeJEPA ViT-L, epoch 50, 1,984 ADE20K val images; "
                        f"{SINK_REFERENCE_RULE})")
DEFINITIONS = ("Strongest head: the (block, head) with the largest mean sink mass, where its dominant key sits most "
               "often, its mass on the prefix tokens and its value ratio. Share mass >= 0.3: of all (image, block, "
               "head) triples. Attn. common-mode share: the common-mode penalty of the attention update (energy of "
               "the token-mean update over the update's energy), mean over blocks; pathway share: the global "
               "pathway's share of the block update's energy.")


def _md_table(ref: dict[str, Any]) -> list[str]:
    return ["| " + " | ".join(ref["columns"]) + " |", "|" + "---|" * len(ref["columns"])] + \
        ["| " + " | ".join(r) + " |" for r in ref["rows"]]


def to_markdown(table: list[dict[str, Any]]) -> str:
    """The leaderboard, its footnotes (marking rule, sink rule) and the reference blocks."""
    cols, (best, few) = _columns(table), significant_best(table)
    lines = ["| variant | seeds | strongest sink at | " + " | ".join(n for _, n in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for t in table:
        cells = [f"**{_cell(t[k], k)}**" if best.get(k) == t["variant"] else _cell(t[k], k) for k, _ in cols]
        lines.append(f"| {t['variant']} | {t['seeds']} | {t['sink_at']} | " + " | ".join(cells) + " |")
    lines += ["", f"Mean ± std over seeds. {_mark_note(few)}", "", " ".join(_rule_notes(table)), "", DEFINITIONS]
    if any(not math.isnan(t[k][0]) for t in table for k, *_ in CAUSAL):
        lines += ["", "Causal columns (`python -m vitsinks.intervene`): final patch tokens' relative RMS change when "
                  "one head's sink value is zeroed (or its sink attention redirected), mean over the head's events "
                  "of that class, then over heads; drop registers: the whole model run without them."]
    lines += ["", "Reference numbers (papers, ViT-L, not comparable in scale with CPU runs):", "",
              *_md_table(REFERENCE), "", *(f"- {n}" for n in REFERENCE["notes"])]
    if _reference_comparable(table):
        lines += ["", f"{SINK_REFERENCE_TITLE}:", "", *_md_table(SINK_REFERENCE)]
    return "\n".join(lines) + "\n"


def _html_table(ref: dict[str, Any], table_id: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ref["columns"])
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in ref["rows"])
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def to_html(table: list[dict[str, Any]], title: str) -> str:
    """The leaderboard as one HTML page with the same footnotes and reference blocks as the Markdown."""
    cols, (best, few) = _columns(table), significant_best(table)
    head = "".join(f"<th>{html.escape(n)}</th>" for _, n in cols)
    body = "".join(
        f"<tr><td>{html.escape(t['variant'])}</td><td>{t['seeds']}</td><td>{html.escape(t['sink_at'])}</td>"
        + "".join(f"<td class=\"{'best' if best.get(k) == t['variant'] else ''}\">{html.escape(_cell(t[k], k))}</td>"
                  for k, _ in cols) + "</tr>" for t in table)
    foot = "".join(f"<p>{html.escape(n)}</p>" for n in [f"Mean ± std over seeds. {_mark_note(few, 'Highlighted')}",
                                                          " ".join(_rule_notes(table)), DEFINITIONS])
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in REFERENCE["notes"])
    sinks = (f"<h2>{html.escape(SINK_REFERENCE_TITLE)}</h2>{_html_table(SINK_REFERENCE, 'reference-sinks')}"
             if _reference_comparable(table) else "")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;margin-bottom:1.5em}}
td,th{{border:1px solid #bbb;padding:4px 8px;text-align:right}} td:first-child,th:first-child{{text-align:left}}
th{{background:#eee}} td.best{{font-weight:bold;background:#e6f4e6}}</style></head>
<body><h1>{html.escape(title)}</h1>
<table id="leaderboard"><thead><tr><th>variant</th><th>seeds</th><th>strongest sink at</th>{head}</tr></thead>
<tbody>{body}</tbody></table>
{foot}
<h2>Reference numbers (papers, ViT-L)</h2>
{_html_table(REFERENCE, "reference")}<ul>{notes}</ul>
{sinks}
<img src="leaderboard.png" alt="quality and sinks per variant" style="max-width:100%"></body></html>
"""


def figure(table: list[dict[str, Any]], path: Path) -> Path:
    """Quality bars (one group per quality metric, `*` over a variant marked by Welch's test), sinks per image split
    by class, and the per-block profile of each variant's strongest-head sink mass side by side (never empty: it
    moves before any sink event); the footnote says the marking and sink rules."""
    quality = [(k, n) for k, n in QUALITY if any(not math.isnan(t[k][0]) for t in table)]
    best, few = significant_best(table)
    variants = [t["variant"] for t in table]
    x = np.arange(len(variants))
    fig, axes = plt.subplots(1, 3, figsize=(21, 4.8), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    width = 0.8 / max(len(quality), 1)
    for i, (k, n) in enumerate(quality):
        means = [t[k][0] for t in table]
        errs = [0 if math.isnan(t[k][1]) else t[k][1] for t in table]
        axes[0].bar(x + i * width, means, width, yerr=errs, label=n, capsize=2)
        for j, t in enumerate(table):
            if best.get(k) == t["variant"]:
                axes[0].text(x[j] + i * width, means[j] + errs[j], "*", ha="center", va="bottom", fontsize=12)
    axes[0].set_xticks(x + width * (len(quality) - 1) / 2, variants, rotation=30, ha="right", fontsize=8)
    axes[0].margins(y=0.08)  # room for the marks
    axes[0].set_ylabel("%")
    axes[0].set_title("quality", fontsize=10)
    axes[0].legend(fontsize=7)
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
        axes[1].text(0.5, 0.6, "no sink events", ha="center", transform=axes[1].transAxes)
    massive = axes[1].twinx()
    massive.plot(x, [t["massive"][0] for t in table], "D", color="tab:red", label="massive act. ratio (max/median)")
    massive.set_ylim(0, np.nanmax([t["massive"][0] for t in table] + [1.0]) * 1.6)
    massive.set_ylabel("massive activation ratio", color="tab:red")
    handles = axes[1].get_legend_handles_labels()
    extra = massive.get_legend_handles_labels()
    axes[1].legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7, loc="upper right")
    _profiles(axes[2], table)
    notes = [f"Mean ± std over seeds. {_mark_note(few, '*')}", *_rule_notes(table)]
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


def build(source: str | Path, out: str | Path, title: str = "vitsinks leaderboard") -> list[dict[str, Any]]:
    """Collect, aggregate and write leaderboard.{md,csv,html,png}; returns the aggregated table."""
    rows = [collect(r) for r in run_dirs(source)]
    table = aggregate(rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files.write_text(out / "leaderboard.md", f"# {title}\n\n" + to_markdown(table))
    with files.atomic_open(out / "leaderboard.csv", newline="") as f:
        w = csv.writer(f)
        keys = [k for k, _ in QUALITY + MECHANISM]
        w.writerow(["variant", "seeds", "sink_at", *(f"{k}_{s}" for k in keys for s in ("mean", "std")),
                    "strongest_mass_by_block"])
        for t in table:
            w.writerow([t["variant"], t["seeds"], t["sink_at"],
                        *(f"{v:.4g}" if k.startswith("causal_") else f"{v:.4f}" for k in keys for v in t[k]),
                        " ".join(f"{v:.4f}" for v in t["profile"])])
    with files.atomic_open(out / "runs.csv", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([{**r, "profile": " ".join(f"{v:.4f}" for v in r["profile"])} for r in rows])
    files.write_text(out / "leaderboard.html", to_html(table, title))
    figure(table, out / "leaderboard.png")
    return table


@dataclass
class LeaderboardArgs:
    runs: str | None = None  # a folder of run directories, or a sweep folder / sweep.json
    out: str | None = None  # default: <runs>/leaderboard (next to sweep.json for a manifest)
    title: str = "vitsinks leaderboard"


USAGE = "python -m vitsinks.leaderboard runs=<folder or sweep> [out=<folder>] [title=...]"


def leaderboard_command(argv: Sequence[str]) -> int:
    args = parse_args(argv, LeaderboardArgs, USAGE)
    if not args.runs:
        raise ConfigError(f"no runs given; usage: {USAGE}")
    out = args.out or str(Path(args.runs).parent / "leaderboard" if args.runs.endswith(".json")
                          else Path(args.runs) / "leaderboard")
    try:
        table = build(args.runs, out, args.title)
    except yaml.YAMLError as err:
        raise BadValue(f"a run's config.yaml does not parse ({err})") from err
    print(to_markdown(table))
    print(f"written: {out}/leaderboard.md, .csv, .html, .png")
    return 0


main = run_command(leaderboard_command)

if __name__ == "__main__":
    main()
