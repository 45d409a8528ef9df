"""A leaderboard row is one experiment: runs are averaged into one row only when everything but the seed matches
(docs/report.md). What defines a run's experiment (`defined`): its resolved config beyond `BOOKKEEPING`, the steps it
trained (`TRAINED`; a derived run's: its source's), a derived run's edited checkpoint (`EDITED`), and the settings its
results were made with (`RESULT_SETTINGS`: a run without such a result does not differ in it). The runs of one
variant that differ become rows named by the keys that differ; two runs of one experiment with one seed are refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.upgrade import saved_names
from vitsinks.report.training import metrics
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import RunDir

# Config keys (and groups: every key under them) that do not define the experiment.
BOOKKEEPING: tuple[str, ...] = (
    "seed", "name", "exp", "runs_dir", "ckpt", "run",  # the seed; names (a run is named by its architecture); paths
    "wandb", "cluster",  # logging; where and on how many devices it ran (train.batch_size is the global batch)
    "data.root", "data.num_workers", "data.prefetch_factor", "data.file_list_cache", "data.on_bad_image",
    "train.cpu_threads", "train.compile", "train.grad_checkpointing", "train.ddp_static_graph", "train.log_every",
    "train.ckpt_every", "train.keep_periodic", "train.periodic_weights_only", "model.fused_attention",
    "diagnostics.enabled", "diagnostics.plots", "diagnostics.report", "diagnostics.report_images",
    "intervene.batch_size", "intervene.shard", "intervene.nshards", "intervene.merge", "intervene.out",
    "eval.after_train", "eval.batch_size", "eval.dense_data", "eval.dense_root", "eval.dense_examples",
    "trainfree.probes", "trainfree.overwrite", "trainfree.source",  # the source: by its checkpoint (EDITED)
    # recorded by the results themselves (QUANT, SINK_RULE), which may have been made with other settings
    "quant", "diagnostics.rule", "diagnostics.eps", "diagnostics.ratio", "diagnostics.use_stable_rank",
    "diagnostics.block0",
)
TRAINED, EDITED = "steps trained", "edited checkpoint"
QUANT, SINK_RULE = "quant", "sink rule"
RESULT_SETTINGS = (QUANT, SINK_RULE)  # read from the results: a run without the result does not differ in it


def bookkeeping(key: str) -> bool:
    """Whether config key `key` (dotted) is one of `BOOKKEEPING` or under one of its groups."""
    return any(key == b or key.startswith(f"{b}.") for b in BOOKKEEPING)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_keys(cfg: DictConfig) -> dict[str, Any]:
    """Every key of the resolved config that defines the experiment (dotted, in the config's order)."""
    tree = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(tree, dict)
    return {k: v for k, v in _flat(saved_names(cast(dict[str, Any], tree))).items() if not bookkeeping(k)}


def steps_trained(run: RunDir) -> int | None:
    """The last step in `run`'s metrics.jsonl (None: no metrics, e.g. an import or a derived run)."""
    logged = [m["step"] for m in metrics(run) if isinstance(m.get("step"), int | float)]
    return int(max(logged)) if logged else None


def rule_setting(record: dict[str, Any] | None) -> str:
    """A summary's sink rule in a few words (`relaxed`, `def1 eps 0.1`), with what is not the default."""
    if not record:
        return "unrecorded"
    words = "relaxed" if record.get("events") == "relaxed" else f"{record.get('events')} eps {shown(record.get('eps'))}"
    if record.get("ratio", "ratio_out") != "ratio_out":
        words += f" {record['ratio']}"
    if not record.get("use_stable_rank", True):
        words += " no stable-rank test"
    if record.get("blocks_counted", "1..L-1") != "1..L-1":
        words += f" blocks {record['blocks_counted']}"
    return words


def defined(cfg: DictConfig, run: RunDir, derived: str | None) -> dict[str, Any]:
    """What defines `run`'s experiment beyond its results' settings (`derived`: its trainfree.source)."""
    out = {**config_keys(cfg), TRAINED: steps_trained(run)}
    if derived is not None:
        out[EDITED] = Path(derived).name or None
    return out


def _key(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def _with_source_steps(row: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A row's definition; a derived run has trained no steps itself: its source run's count (None: not here)."""
    got = dict(row.get("_defined", {}))
    if row.get("_derived_from") is not None and TRAINED in got:
        got[TRAINED] = by_name.get(row.get("source", ""), {}).get("_defined", {}).get(TRAINED)
    return got


def _split_on(parts: list[tuple[dict[str, Any], list[dict]]], key: str) -> list[tuple[dict[str, Any], list[dict]]]:
    """Split each part on result setting `key` where its runs that have it differ, else give it their value."""
    out = []
    for d, runs in parts:
        values = [r.get("_settings", {}).get(key) for r in runs]
        seen = sorted({v for v in values if v is not None}, key=str)
        if len(seen) <= 1:
            out.append(({**d, key: seen[0] if seen else None}, runs))
            continue
        for v in [*seen, None]:
            if members := [r for r, w in zip(runs, values, strict=True) if w == v]:
                out.append(({**d, key: v}, members))
    return out


def _order(v: Any) -> tuple:
    """Sort key of a setting's value: numbers by value, then text, then none."""
    if isinstance(v, bool) or v is None:
        return (2 if v is None else 1, str(v))
    return (0, float(v), "") if isinstance(v, int | float) else (1, _key(v) if isinstance(v, list | dict) else str(v))


def shown(v: Any) -> str:
    """A setting's value as a row name shows it."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}" if math.isfinite(v) else str(v)
    if isinstance(v, list):
        return "[" + ", ".join(shown(x) for x in v) + "]"
    return str(v)


def experiments(runs: list[dict[str, Any]], by_name: dict[str, dict[str, Any]]) -> list[tuple[dict[str, Any],
                                                                                                  list[dict]]]:
    """The experiments among one (data, variant)'s runs: (what tells it from the others, its runs), sorted; one
    experiment: ({}, runs). Two runs of one experiment and one seed are a `BadValue`."""
    parts: dict[str, tuple[dict[str, Any], list[dict]]] = {}
    for r in runs:
        d = _with_source_steps(r, by_name)
        parts.setdefault(_key(d), (d, []))[1].append(r)
    found = list(parts.values())
    for key in RESULT_SETTINGS:
        found = _split_on(found, key)
    for _, members in found:
        seeds = [m.get("seed") for m in members]
        if twice := sorted({s for s in seeds if seeds.count(s) > 1}, key=str):
            names = [m.get("run", "?") for m in members if m.get("seed") == twice[0]]
            raise BadValue(f"runs {', '.join(names)} are one experiment with one seed ({twice[0]}): a leaderboard row "
                           f"averages seeds, so tabulate one of them (or train them with different seeds)")
    if len(found) == 1:
        return [({}, found[0][1])]
    keys = list(dict.fromkeys(k for d, _ in found for k in d))
    differ = [k for k in keys if len({_key({"v": d.get(k)}) for d, _ in found}) > 1
              and (k not in RESULT_SETTINGS or len({d.get(k) for d, _ in found} - {None}) > 1)]
    out = sorted([({k: d.get(k) for k in differ}, members) for d, members in found],
                 key=lambda item: [_order(item[0][k]) for k in differ])
    return [(_as_runs_have(differs, members), members) for differs, members in out]


def _as_runs_have(differs: dict[str, Any], members: list[dict[str, Any]]) -> dict[str, Any]:
    """What tells a row from the others, as its runs have it (`W4A4 in 1 of 2 runs`)."""
    out: dict[str, Any] = {}
    for k, v in differs.items():
        if k in RESULT_SETTINGS:
            if v is None:
                continue
            have = sum(1 for m in members if m.get("_settings", {}).get(k) == v)
            v = v if have == len(members) else f"{shown(v)} in {have} of {len(members)} runs"
        out[k] = v
    return out


def named(variant: str, differs: dict[str, Any]) -> str:
    """A row's name: its variant, then what tells its experiment from the variant's other rows, `key=value`."""
    return f"{variant} ({', '.join(f'{k}={shown(v)}' for k, v in differs.items())})" if differs else variant
