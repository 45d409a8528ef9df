"""A derived run cut short is finished by the command that made it (docs/trainfree.md#the-derived-run): the same edit
(method, source, `edit_settings`) is redone in place, another edit is refused and a finished run is kept;
`finish_command` names the command that finishes it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.posthoc_schema import QuantConfig, TrainFreeConfig
from vitsinks.posthoc.method import METHODS, TrainFreeMethod
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import RunDir

SKIPPED = ("method", "source", "overwrite", "probes")  # what the group records beside the edit's own settings
DEFAULTS = {"trainfree": TrainFreeConfig(), "quant": QuantConfig()}  # a group's settings a command line need not give


def edit_settings(group: Any) -> dict[str, Any]:
    """The settings of the edit in a method's config `group` (`trainfree` or `quant`): every key but `SKIPPED`."""
    tree = (cast(dict[str, Any], OmegaConf.to_container(group, resolve=True)) if isinstance(group, DictConfig)
            else dict(group or {}))
    return {k: v for k, v in tree.items() if k not in SKIPPED}


def _same_path(a: Any, b: Any) -> bool:
    return a is not None and b is not None and Path(str(a)).absolute() == Path(str(b)).absolute()


def edit_differences(recorded: DictConfig, m: type[TrainFreeMethod], settings: Any, source: str) -> list[str]:
    """How the edit `recorded` in a derived run differs from `m` with `settings` of `source` (empty: the same)."""
    out = []
    there = OmegaConf.select(recorded, "trainfree.method")
    if there != m.name:
        out.append(f"trainfree.method ({there} there, {m.name} now)")
    if not _same_path(OmegaConf.select(recorded, "trainfree.source"), source):
        out.append(f"source ({OmegaConf.select(recorded, 'trainfree.source')} there, {source} now)")
    old, new = edit_settings(recorded.get(m.group)), edit_settings(settings)
    out += [f"{m.group}.{k} ({old.get(k)} there, {new.get(k)} now)" for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)]
    return out


def status(run: RunDir) -> dict[str, Any]:
    """What the run's `status.json` says (`{"status": "missing"}` without one, `"torn"` when unreadable)."""
    if not run.status.is_file():
        return {"status": "missing"}
    try:
        said = files.read_json(run.status, "")
    except files.BadFile:
        return {"status": "torn"}
    return said if isinstance(said.get("status"), str) else {"status": "torn"}


def keep_or_redo(run: RunDir, recorded: DictConfig, m: type[TrainFreeMethod], settings: Any, source: str) -> None:
    """Under the run's lock, before a derived run is replaced without `overwrite`: a `BadValue` when it holds another
    edit or the same edit finished; else (the same edit cut short) a printed note, and the caller derives it again."""
    if differs := edit_differences(recorded, m, settings, source):
        raise BadValue(f"{run.path} exists already with another edit ({'; '.join(differs)}): its results would mix "
                       f"two edits: delete it, or pass trainfree.overwrite=true to replace it and its results")
    said = status(run)
    if said["status"] == "finished":
        raise BadValue(f"{run.path} is derived already with these settings and finished: its results are there; pass "
                       f"trainfree.overwrite=true to derive it again")
    print(f"{run.path} holds this edit but did not finish ({describe(said)}): deriving it again", flush=True)


UNFINISHED = {"running": "killed while it was written", "missing": "killed before its status was written",
              "torn": "its status.json is torn"}


def describe(said: dict[str, Any]) -> str:
    """A derived run's unfinished state in words, from its `status.json` (`status`), for a run no process writes."""
    state = said.get("status")
    if state in UNFINISHED:
        return UNFINISHED[state]
    error = " ".join(str(said.get("error") or "").split())
    return f"{state}: {error[:120]}" if error else str(state)


def finish_command(run: RunDir, cfg: DictConfig) -> str:
    """The command that finishes the derived run `run` (config `cfg`), with its non-default settings."""
    name = str(OmegaConf.select(cfg, "trainfree.method"))
    m = METHODS[name] if name in METHODS else None
    source = OmegaConf.select(cfg, "trainfree.source")
    if m is None or not source:
        return f"delete {run.path} and derive it again: its config does not name its edit or source"
    group = cfg.get(m.group) or {}
    default = DEFAULTS[m.group]
    args = [f"ckpt={source}"]
    if m.group == "trainfree":
        args.append(f"trainfree.method={m.name}")
    args += [f"{m.group}.{k}={v}" for k, v in edit_settings(group).items() if getattr(default, k, None) != v]
    if group.get("probes") is False:
        args.append(f"{m.group}.probes=false")
    if m.group == "trainfree":
        args.append(f"runs_dir={run.path.parent}")
    module = "vitsinks.quantize" if m.group == "quant" else "vitsinks.trainfree"
    return f"python -m {module} " + " ".join(shlex.quote(a) for a in args)
