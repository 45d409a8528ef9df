"""The run's page over training (docs/report.md): `diagnostics/report.html` beside `report.json` (every number the
page shows) and `training_curves.png`, from the step diagnoses and the metrics on disk."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import numpy as np

from vitsinks.diagnostics.page import REPORT, REPORT_JSON, TRAINING_PNG, rounded
from vitsinks.diagnostics.page_figures import figure_uri, num, over_training_figure, page, panel, training_figure
from vitsinks.diagnostics.rules import CLASSES
from vitsinks.utils import files
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.metrics_log import read_metrics
from vitsinks.utils.plotting import save_figure, swatches_html
from vitsinks.utils.rundir import RunDir


def run_data(run: RunDir) -> dict[str, Any]:
    """Every number of a run's page over training, from the step diagnoses on disk."""
    steps = run.diagnosed_steps()
    if not steps:
        raise InputNotFound(f"no diagnostics/step_*/summary.json in {run.path}: diagnose the run's checkpoints first "
                            f"(python -m vitsinks.diagnose run={run.path})")
    rows = []
    for step in sorted(steps):
        s = files.read_json(steps[step], run.rediagnose(steps[step].parent.name))
        res = s.get("residual") or {}
        q = res.get("norm_quantiles_by_block") or {}
        top = res.get("top_activations") or {}
        mass = (s.get("strongest_head_by_block") or {}).get("mass") or s.get("max_mass_by_block")
        page_path = steps[step].parent / REPORT
        prefix = (s.get("strongest_head_by_block") or {}).get("prefix_mass")
        rows.append({"step": step, "checkpoint": steps[step].parent.name,
                     "sinks_per_image": {c: s["sinks_per_image"][c]["all"] for c in (*CLASSES, "all")},
                     "strongest_mass_by_block": mass, "max_strongest_mass": max(mass) if mass else None,
                     "max_prefix_mass": max(prefix) if prefix else None, "mass_share": s.get("mass_share"),
                     "max_norm": max(q["max"]) if q.get("max") else None,
                     "top_activation_ratio": largest(top.get("ratio_by_block")),
                     "report": f"{page_path.parent.name}/{REPORT}" if page_path.is_file() else None})
    final = run.diagnostics("final") / REPORT
    return {"run": run.name, "checkpoints": len(rows), "steps": rows, "training": training_data(run),
            "final_report": f"final/{REPORT}" if final.is_file() else None}


TRAIN_SERIES = ("loss", "probe_acc")  # logged every train.log_every steps; and every validation metric (val/...)


def training_data(run: RunDir) -> dict[str, Any]:
    """The training curves (`{series: {metric: [[step, value], ...]}}`) and why there are none (`missing`)."""
    metrics = read_metrics(run.path)
    series: dict[str, list[list[float]]] = {}
    for m in metrics:
        for k, v in m.items():
            if (k in TRAIN_SERIES or k.startswith("val/")) and isinstance(v, int | float) and math.isfinite(v):
                series.setdefault(k, []).append([int(m["step"]), rounded(float(v))])
    missing = None if series else (f"no metrics.jsonl in {run.name}: the run was not trained here (an import?)"
                                   if not metrics else "metrics.jsonl logs no loss or probe")
    return {"series": series, "missing": missing}


# The validation metrics the page states in words (their last value; `vitsinks.objectives.monitors`): label, scale
LAST_VALIDATION = {"val/probe_acc": ("online probe top-1", 100, "%"), "val/top1": ("top-1", 100, "%"),
                   "val/knn_top1": ("k-NN top-1", 100, "%"), "val/rankme": ("RankMe", 1, "")}


def last_validation(training: dict[str, Any]) -> str:
    """The last validation's numbers in words (`LAST_VALIDATION`; empty when the run logged none)."""
    series = training.get("series", {})
    last = {k: series[k][-1] for k in LAST_VALIDATION if series.get(k)}
    if not last:
        return ""
    step = max(s for s, _ in last.values())
    parts = [f"{label} {num(scale * last[k][1])}{unit}" for k, (label, scale, unit) in LAST_VALIDATION.items()
             if k in last]
    return f"Last validation (step {num(step)}): {', '.join(parts)}."


def largest(ratios: list[float | None] | None) -> float | None:
    """The largest ratio of a per-block list; None where one is None (a zero median: unbounded)."""
    if not ratios or any(r is None for r in ratios):
        return None
    return max(r for r in ratios if r is not None)


def run_html(data: dict[str, Any]) -> str:
    """The run page from its data (`run_data`)."""
    rows = data["steps"]
    n_blocks = max(len(r["strongest_mass_by_block"] or []) for r in rows)
    mass = np.array([(r["strongest_mass_by_block"] or []) + [np.nan] * (n_blocks - len(r["strongest_mass_by_block"]
                                                                                       or [])) for r in rows]).T
    residual = {k: [r[k] for r in rows] for k in ("max_norm", "top_activation_ratio")
                if any(r[k] is not None for r in rows)}
    fig = over_training_figure([r["step"] for r in rows], {c: [r["sinks_per_image"][c] for r in rows]
                                                           for c in (*CLASSES, "all")},
                               mass, {k.replace("_", " "): v for k, v in residual.items()})
    head = ["step", *(f"sinks / image: {c}" for c in (*CLASSES, "all")), "max strongest mass",
            *(["max token norm"] if "max_norm" in residual else []),
            *(["top activation ratio"] if "top_activation_ratio" in residual else []), "report page"]
    cells = []
    for r in rows:
        link = f'<a href="{html.escape(r["report"])}">{html.escape(r["checkpoint"])}</a>' if r["report"] else "-"
        cells.append(f"<tr><td>{num(r['step'])}</td>" + "".join(
            f"<td>{num(r['sinks_per_image'][c])}</td>" for c in (*CLASSES, "all")) +
            f"<td>{num(r['max_strongest_mass'])}</td>" +
            "".join(f"<td>{num(r[k])}</td>" for k in residual) + f"<td>{link}</td></tr>")
    hd = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    final = (f'<p>The final diagnosis: <a href="{html.escape(data["final_report"])}">its report page</a>.</p>'
             if data["final_report"] else "")
    curves = figure_uri(training_figure(data.get("training") or {}, rows))
    said = last_validation(data.get("training") or {})
    body = panel("curves", "Training curves", f'<img class="fig full" src="{curves}" alt="training curves">'
                 + (f'<p id="last-validation">{html.escape(said)}</p>' if said else "") +
                 '<p class="note">Loss, online probe and k-NN monitor (or the sink task\'s error), the continuous '
                 "sink measures of the diagnosed checkpoints and RankMe of the validation embeddings, against the "
                 "step; a falling k-NN top-1 or RankMe warns of a collapsing representation. training_curves.png "
                 "beside this page.</p>") + \
        panel("training", "Sinks over training", f'<img class="fig full" src="{fig}" alt="sinks over training">'
              f'<p class="legend">{swatches_html((*CLASSES, "all"))}</p>'
              f'{final}<table id="steps"><thead><tr>{hd}</tr></thead><tbody>{"".join(cells)}</tbody></table>')
    return page(f"Sinks over training: {data['run']}", f"{num(data['checkpoints'])} diagnosed checkpoints.", body,
                [("curves", "training curves"), ("training", "sinks over training")])


def training_curves(run: RunDir, data: dict[str, Any] | None = None) -> Path:
    """Write `diagnostics/training_curves.png`: the run page's training curves (`training_figure`)."""
    data = data or run_data(run)
    return save_figure(training_figure(data["training"], data["steps"]), run.diagnostics_root / TRAINING_PNG)


def run_report(run: RunDir) -> Path:
    """Write a run's `diagnostics/report.html`, `report.json` and `training_curves.png` (docs/report.md)."""
    data = run_data(run)
    files.write_json(run.diagnostics_root / REPORT_JSON, data)
    files.write_text(run.diagnostics_root / REPORT, run_html(data))
    training_curves(run, data)
    return run.diagnostics_root / REPORT
