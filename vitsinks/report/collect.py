"""Collect: one row per run from its registered results and the mitigations' columns, then mean +- std over the
seeds of each experiment (`vitsinks.report.experiment`). A run is named by its architecture (`run_variant`), an
import by its own name, a derived run by its source's and its edit. A derived run's probe value is shown only where
its source run is in the leaderboard, probed the same way (column, seed, checkpoint); else "not comparable".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

import vitsinks.interventions.report  # noqa: F401

# the modules whose result types the leaderboard shows (each registers its own on import)
import vitsinks.probes.probe_results  # noqa: F401
import vitsinks.report.training  # noqa: F401
from vitsinks.configs.upgrade import upgrade
from vitsinks.configs.variants import variant_order
from vitsinks.diagnostics.summary import DiagnosticsSummary
from vitsinks.models import run_variant
from vitsinks.models.mitigations import MITIGATIONS, mitigation_columns
from vitsinks.posthoc import edited_variant
from vitsinks.quant.quant_results import QuantResult  # registers it too
from vitsinks.report.experiment import QUANT, SINK_RULE, defined, experiments, named, rule_setting
from vitsinks.utils.columns import GROUPS, Column
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.results import Probed, result_types
from vitsinks.utils.rundir import RunDir, find_runs
from vitsinks.utils.runstate import read_manifest
from vitsinks.utils.stats import nan_mean_std

NOT_COMPARABLE = "not comparable"  # a derived row's cell that its source's probe cannot be read against


def columns(keys: Iterable[str] = ()) -> list[Column]:
    """Every leaderboard column, by group, with those a result type adds for collected `keys`."""
    found = set(keys)
    cols = [c for t in result_types() for c in (*t.columns(), *t.extra_columns(found))] + mitigation_columns()
    keys_seen = [c.key for c in cols]
    if twice := sorted({k for k in keys_seen if keys_seen.count(k) > 1}):
        raise ValueError(f"several leaderboard columns are keyed {', '.join(twice)}: one column holds one result's "
                         f"values (one probe protocol); give each result type its own keys")
    return sorted(cols, key=lambda c: GROUPS.index(c.group))  # stable: registry order within a group


def quality(cols: Iterable[Column]) -> list[Column]:
    """The columns a variant can be best in (Welch-marked): the quality group's."""
    return [c for c in cols if c.group == "quality"]


def run_dirs(source: str | Path) -> list[RunDir]:
    """Run directories of a sweep (folder or sweep.json) or every folder with a config.yaml under `source`."""
    src = Path(source)
    if src.name == "sweep.json" or (src / "sweep.json").is_file():
        return [RunDir(r["run_dir"]) for r in read_manifest(src)["runs"]]
    if not src.is_dir():
        raise InputNotFound(f"runs={src} is neither a run folder nor a sweep")
    found = find_runs(src)
    if not found:
        raise InputNotFound(f"no run directories (with config.yaml) under {src}")
    return found


def _mitigation_values(summary: DiagnosticsSummary | None) -> dict[str, Any]:
    """The mitigations' columns, read from the run's newest diagnostics summary (NaN where absent)."""
    out: dict[str, Any] = {c.key: math.nan for c in mitigation_columns()}
    if summary is not None:
        for m in MITIGATIONS.values():
            out.update(m.leaderboard_values(summary.to_json()))
    return out


def source_run(source: str | None) -> str:
    """The run a derived run's `trainfree.source` checkpoint belongs to; empty when none."""
    path = Path(source or "")
    return path.parents[1].name if path.parent.name == "checkpoints" and len(path.parents) > 1 else ""


def collect(run: RunDir | Path | str) -> dict[str, Any]:
    """One leaderboard row from a run directory (missing evaluations NaN), with the private `_*` fields."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    cfg = upgrade(OmegaConf.load(run.config), str(run.config))
    trained = cfg.imported or run_variant(cfg)  # a pretrained model's rows are named by it, not by its architecture
    derived = str(cfg.trainfree.source or "") if cfg.trainfree.method else None
    row: dict[str, Any] = {"run": run.name, "variant": edited_variant(trained, cfg.trainfree),
                           "source": source_run(derived), "seed": cfg.seed, "model": cfg.model.size,
                           "data": cfg.data.name}
    probed: dict[str, Probed] = {}
    for t in result_types():
        row.update(t.collect(run))
        probed.update(t.probed(run))
    summary = DiagnosticsSummary.load(run)
    row.update(_mitigation_values(summary))
    settings = {QUANT: QuantResult.format_of(run),
                SINK_RULE: None if summary is None else rule_setting(summary.rule)}
    row.update(_derived_from=derived, _probed=probed, _defined=defined(cfg, run, derived), _settings=settings)
    return row


def unlike_source(row: dict[str, Any], source: dict[str, Any] | None, col: Column) -> str | None:
    """Why derived run `row`'s value in `col` cannot be read against its source run's; None when it can."""
    if not row["_derived_from"]:
        return "its source checkpoint is not recorded (trainfree.source in its config.yaml): derive it again"
    if source is None:
        return f"its source {row['source'] or row['_derived_from']} is not in this leaderboard"
    if source["data"] != row["data"]:
        return f"its source {source['run']} is of other data ({source['data']}, not {row['data']})"
    if math.isnan(source.get(col.key, math.nan)):
        return f"its source {source['run']} has no {col.label} (run the {col.probe} on it)"
    ours, theirs = row.get("_probed", {}).get(col.key), source.get("_probed", {}).get(col.key)
    if ours is None or theirs is None or None in (ours.seed, theirs.seed):
        return f"the probe seed of it or of its source {source['run']} is not recorded (probe both again)"
    if ours.seed != theirs.seed:
        return (f"probed with seed {ours.seed}, its source {source['run']} with seed {theirs.seed} (probe both with "
                f"one seed)")
    made_from = Path(row["_derived_from"]).name
    if theirs.checkpoint != made_from:
        return (f"its source {source['run']}'s {col.label} is of {theirs.checkpoint or 'an unrecorded checkpoint'}, "
                f"the edit of {made_from}")
    return None


def _not_comparable(group: list[dict[str, Any]], rows: dict[str, dict[str, Any]], col: Column) -> list[str]:
    """Why a derived row's cell in probe column `col` is not comparable, one reason per run (empty: it is)."""
    return [f"{r['run']}: {why}" for r in group if not math.isnan(r.get(col.key, math.nan))
            and (why := unlike_source(r, rows.get(r.get("source", "")), col))]


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over the seeds of each experiment, one row each, named by what `differs`."""
    order = {v: i for i, v in enumerate(variant_order())}
    def place(key: tuple[str, str]) -> tuple:  # a post-hoc edit's row right after its trained variant's
        trained, _, edit = key[1].partition(" + ")  # numbers in a name by value: reg8 before reg16
        return key[0], order.get(trained, 99), [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", trained)], edit

    keys = sorted({(r["data"], r["variant"]) for r in rows}, key=place)
    several = len({k[0] for k in keys}) > 1
    cols = columns({k for r in rows for k in r})
    by_name = {r["run"]: r for r in rows if "run" in r}
    out = []
    for data, v in keys:
        for differs, group in experiments([r for r in rows if r["variant"] == v and r["data"] == data], by_name):
            out.append(_row(group, named(v, differs), differs, data, several, cols, by_name))
    return out


def _row(group: list[dict[str, Any]], name: str, differs: dict[str, Any], data: str, several: bool,
         cols: list[Column], by_name: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The aggregated row of one experiment's runs `group`."""
    agg: dict[str, Any] = {"variant": f"{data} / {name}" if several else name, "seeds": len(group), "data": data,
                           "differs": differs}
    places = sorted({r.get("sink_at", "-") for r in group})
    agg["sink_at"] = places[0] if len(places) == 1 else " / ".join(places)
    profiles = [r["profile"] for r in group if r.get("profile")]
    agg["profile"] = np.mean(profiles, axis=0).tolist() if profiles else []
    agg["sink_rules"] = sorted({r.get("sink_rule", "-") for r in group} - {"-"})
    agg["n"], agg["not_comparable"] = {}, {}
    derived = [r for r in group if r.get("_derived_from") is not None]
    for c in cols:
        if c.probe and derived and (why := _not_comparable(derived, by_name, c)):
            agg["not_comparable"][c.key] = why  # no value: nothing to read, mark or draw against the source
            agg[c.key], agg["n"][c.key] = (math.nan, math.nan), 0
            continue
        mean, std, agg["n"][c.key] = nan_mean_std(r.get(c.key, math.nan) for r in group)
        agg[c.key] = (mean, std)
    return agg
