"""Collect: one row per run from its registered results, then mean +- std over seeds per (data, variant).

The columns are those of the registered result types (`vitsinks.utils.results.result_types`, in rank order) and
the block mitigations' (`vitsinks.models.mitigations.mitigation_columns`, read from the diagnostics summary), shown
in the order of their groups (quality, mechanism, causal). A run is named by its architecture
(`vitsinks.models.run_variant`), not by the exp config it was launched with; an imported pretrained model
(`vitsinks.run.imported`) by its own name; a derived run by its source's name and its edit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

# the modules whose result types the leaderboard shows (each registers its own on import)
import vitsinks.eval.results  # noqa: F401
import vitsinks.interventions.report  # noqa: F401
import vitsinks.quant.results  # noqa: F401
import vitsinks.report.training  # noqa: F401
from vitsinks.configs.schema import exp_names, upgrade
from vitsinks.diagnostics.summary import DiagnosticsSummary
from vitsinks.models import run_variant
from vitsinks.models.mitigations import MITIGATIONS, mitigation_columns
from vitsinks.run.sweep import read_manifest
from vitsinks.trainfree import edited_variant
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.results import GROUPS, Column, result_types
from vitsinks.utils.rundir import RunDir, find_runs
from vitsinks.utils.stats import nan_mean_std

LEADING = ["base", "gate", "reg", "gate+reg"]  # the four variants of the study first, then the rest by name


def variant_order() -> list[str]:
    """Every variant that has a config (`vitsinks/configs/exp/*.yaml`), the study's four first."""
    names = exp_names()
    return [v for v in LEADING if v in names] + [v for v in names if v not in LEADING]


def columns(keys: Iterable[str] = ()) -> list[Column]:
    """Every leaderboard column, by group: the registered results', the mitigations', and those a result type
    adds for collected `keys` it has no fixed column for (e.g. a dense probe of new data)."""
    found = set(keys)
    cols = [c for t in result_types() for c in (*t.columns(), *t.extra_columns(found))] + mitigation_columns()
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


def _mitigation_values(run: RunDir) -> dict[str, Any]:
    """The mitigations' columns, read from the run's newest diagnostics summary (NaN where absent)."""
    out: dict[str, Any] = {c.key: math.nan for c in mitigation_columns()}
    summary = DiagnosticsSummary.load(run)
    if summary is not None:
        for m in MITIGATIONS.values():
            out.update(m.leaderboard_values(summary.to_json()))
    return out


def collect(run: RunDir | Path | str) -> dict[str, Any]:
    """One leaderboard row from a run directory; missing evaluations are NaN."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    cfg = upgrade(OmegaConf.load(run.config), str(run.config))
    trained = cfg.imported or run_variant(cfg)  # a pretrained model's rows are named by it, not by its architecture
    row: dict[str, Any] = {"run": run.name, "variant": edited_variant(trained, cfg.trainfree),
                           "seed": cfg.seed, "model": cfg.model.size, "data": cfg.data.name}
    for t in result_types():
        row.update(t.collect(run))
    row.update(_mitigation_values(run))
    return row


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (data, variant) (std over n >= 2 seeds; NaN columns stay NaN). With several
    datasets in one leaderboard, a row's name is `<data> / <variant>`."""
    order = {v: i for i, v in enumerate(variant_order())}
    def place(key: tuple[str, str]) -> tuple:  # a post-hoc edit's row right after its trained variant's
        trained, _, edit = key[1].partition(" + ")
        return key[0], order.get(trained, 99), trained, edit

    keys = sorted({(r["data"], r["variant"]) for r in rows}, key=place)
    several = len({k[0] for k in keys}) > 1
    cols = columns({k for r in rows for k in r})
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
        for c in cols:
            mean, std, n = nan_mean_std(r.get(c.key, math.nan) for r in group)
            agg[c.key] = (mean, std)
            agg["n"][c.key] = n
        out.append(agg)
    return out
