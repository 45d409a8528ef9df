"""Sweeps: expanding `-m` overrides, and the state of each run (the `sweep.json` manifest: `utils.runstate`)."""

from __future__ import annotations

import hashlib
import itertools
import re
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.upgrade import upgrade
from vitsinks.configs.user_inputs import quote_unicode, unicode_fix
from vitsinks.utils import files
from vitsinks.utils.errors import ConfigError
from vitsinks.utils.metrics_log import read_metrics
from vitsinks.utils.rundir import RunDir
from vitsinks.utils.runstate import lock_held, locked_here
from vitsinks.utils.safeload import torch_load

# Overrides already in the default run name `<exp>-<size>-<data>-s<seed>`, or that do not change what a run computes.
IN_NAME = ("exp", "seed", "model", "model.size", "data", "data.name", "name")
NOT_RUN = ("cluster", "runs_dir", "wandb", "hydra", "eval", "diagnostics", "intervene")
# The fields that decide how many steps a run has: a finished run is relaunched when one of them changed.
LENGTH_KEYS = ("train.epochs", "train.max_steps", "train.batch_size", "data.train_size")


def expand(overrides: list[str]) -> list[list[str]]:
    """Hydra's basic-sweeper semantics: the cartesian product of the comma lists / ranges / choices."""
    try:
        parsed = OverridesParser.create().parse_overrides(quote_unicode(overrides))
    except OverrideParseException as err:
        raise ConfigError(unicode_fix(overrides) or f"cannot parse the sweep's overrides: {' '.join(str(err).split())}"
                          ) from None
    axes = []
    for o in parsed:
        key = o.get_key_element()
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        axes.append([f"{key}={v}" for v in values])
    return [list(combo) for combo in itertools.product(*axes)]


def sweep_dir(runs_dir: str | Path, overrides: list[str]) -> Path:
    """A sweep's folder: the same command line (in any order) always maps to the same folder."""
    digest = hashlib.sha1("\n".join(sorted(overrides)).encode()).hexdigest()[:10]
    return Path(runs_dir).resolve() / "sweeps" / f"sweep-{digest}"


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def name_runs(combos: list[list[str]], cfgs: list[DictConfig]) -> None:
    """Give every run of a sweep its own directory (the name gets the swept overrides); a clash is a `ConfigError`."""
    swept = [k for k in dict.fromkeys(_key(o) for c in combos for o in c)
             if len({next((o for o in c if _key(o) == k), None) for c in combos}) > 1]
    extra = [k for k in swept if k not in IN_NAME and k.split(".")[0] not in NOT_RUN]
    named = any(_key(o) == "name" for c in combos for o in c)
    if extra and not named:
        for combo, cfg in zip(combos, cfgs, strict=True):
            values = {_key(o): o.split("=", 1)[1] for o in combo}
            suffix = "-".join(f"{k.split('.')[-1]}{values.get(k, 'default')}" for k in extra)
            suffix = re.sub(r"[^A-Za-z0-9._+=-]", "_", suffix)
            if len(suffix) > 48:
                suffix = "h" + hashlib.sha1(suffix.encode()).hexdigest()[:10]
            cfg.name = f"{cfg.name}-{suffix}"
    seen: dict[str, int] = {}
    for i, cfg in enumerate(cfgs):
        if cfg.name in seen:
            raise ConfigError(f"runs {seen[cfg.name]} and {i} of the sweep would share the run directory "
                              f"{cfg.name!r}: sweep name=... too, or leave name to its default")
        seen[cfg.name] = i


def run_state(run_dir: Path) -> dict[str, Any]:
    """What a run directory says about itself: status, step, total steps, last loss. Read only: a `running` run no
    process holds is `killed`, a torn status.json `unreadable`, both with a `note`."""
    run = RunDir(run_dir)
    info: dict[str, Any] = {"status": "pending", "step": 0}
    if run.status.exists():
        try:
            info.update(files.read_json(run.status, "relaunch the run"))
        except files.BadFile as err:
            info.update(status="unreadable", note=str(err))
    try:
        losses = [m for m in read_metrics(run_dir) if "loss" in m]
    except files.BadFile as err:
        losses, info["note"] = [], str(err)
    if losses:
        info["last_loss"] = losses[-1]["loss"]
        if info["status"] in ("running", "pending"):  # a failed run's step is its last saved one: kept
            info["step"] = max(info.get("step", 0), losses[-1]["step"])
    if info["status"] == "running" and lock_held(run) is False and locked_here(run):
        step = last_checkpoint_step(run)
        info.update(status="killed", note="no process holds the run; " + (
            f"last checkpoint step {step}" if step is not None else "no checkpoint yet"))
    return info


def last_checkpoint_step(run: RunDir) -> int | None:
    """The step of the newest checkpoint of `run` that reads (its tensors mapped, not read), or None."""
    for path in run.resume_candidates():
        try:
            return int(torch_load(path, mmap=True)["progress"]["step"])
        except Exception:  # noqa: BLE001 - a checkpoint that does not read: the next one
            continue
    return None


def is_finished(run_dir: Path, cfg: DictConfig) -> bool:
    """The run finished all its steps (and its probes) and `cfg` changes none of `LENGTH_KEYS`."""
    s = run_state(run_dir)
    if not (s["status"] == "finished" and s["step"] >= s.get("total_steps", 0)):
        return False
    if OmegaConf.select(cfg, "eval.after_train", default=False) and not s.get("evaluated"):
        return False
    saved = RunDir(run_dir).config
    if not saved.is_file():
        return False
    old = upgrade(OmegaConf.load(saved), str(saved))
    return all(OmegaConf.select(old, k) == OmegaConf.select(cfg, k) for k in LENGTH_KEYS)


def carry_over(old: dict[str, Any] | None, entries: list[dict[str, Any]], todo: list[int],
               cluster: str) -> dict[str, Any]:
    """Fill the new manifest's entries from the old one and mark their state; return the fields to keep."""
    previous = {e["run_dir"]: e for e in (old or {}).get("runs", [])}
    for i, e in enumerate(entries):
        before = previous.get(e["run_dir"], {})
        e.update({k: before[k] for k in ("job_id", "stdout", "stderr") if k in before})
        e.setdefault("job_id", None)
        e["cluster"] = cluster
        e["state"] = "pending" if i in todo else "finished (not relaunched)"
    meta: dict[str, Any] = {}
    if old and old.get("array_job_id"):
        meta["array_job_id"] = old["array_job_id"]
        meta["earlier_array_job_ids"] = [*old.get("earlier_array_job_ids", []), old["array_job_id"]] if todo \
            and cluster == "slurm" else old.get("earlier_array_job_ids", [])
    return meta


def entry(index: int, overrides: list[str], cfg: DictConfig) -> dict[str, Any]:
    return {"index": index, "overrides": overrides, "name": cfg.name, "exp": cfg.exp, "seed": cfg.seed,
            "run_dir": str(Path(cfg.runs_dir).resolve() / cfg.name)}


def table(entries: list[dict[str, Any]], columns: list[str]) -> str:
    """Plain-text table of manifest entries."""
    rows = [[str(e.get(c, "")) for c in columns] for e in entries]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*columns)] + [fmt.format(*r) for r in rows])
