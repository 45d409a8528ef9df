"""Derived runs that did not finish, kept out of a leaderboard's tables and named in its footnotes with the command
that finishes them; a run whose quantized copy did not finish stays, its footnote saying so. A copy of a run's
results without checkpoints (a leaderboard's inputs) holds no `status.json` and is tabulated as it is.
"""

from __future__ import annotations

from typing import cast

from omegaconf import DictConfig, OmegaConf

from vitsinks.posthoc.resume import describe, finish_command, status
from vitsinks.quant.quant_results import QuantResult
from vitsinks.utils.rundir import RunDir
from vitsinks.utils.runstate import lock_held

NOTE = "Not finished"  # each footnote line starts so


def _state(run: RunDir) -> str | None:
    """Why a derived run did not finish (None: it did); `being written` while a process holds its lock."""
    said = status(run)
    copy = not run.ckpt_dir.is_dir() and (any(run.results.glob("*.json")) or run.latest_summary() is not None)
    if said["status"] == "finished" or (said["status"] == "missing" and copy):
        return None  # finished; or a copy of a run's results (a leaderboard's inputs, a bank): no status is copied
    if said["status"] == "running" and lock_held(run):
        return "being written now"
    return describe(said)


def unfinished(run: RunDir) -> str | None:
    """The footnote line of `run` when it is a derived run that did not finish (left out of the table), else None."""
    if not run.config.is_file():
        return None
    cfg = cast(DictConfig, OmegaConf.load(run.config))  # a run's config: a mapping
    if not OmegaConf.select(cfg, "trainfree.method") or (state := _state(run)) is None:
        return None
    fix = "tabulate again once it has finished" if state == "being written now" else \
        f"finish it with `{finish_command(run, cfg)}`"
    return f"{NOTE}: {run.name} is left out ({state}): {fix}."


def unfinished_quantization(run: RunDir) -> list[str]:
    """The footnote lines of the quantized copies of `run` (`<run>/quant/<format>/`) that did not finish."""
    out = []
    for derived in run.quantized_runs():
        if (state := _state(derived)) is None:
            continue
        shown = "are an earlier quantization's" if run.result(QuantResult.kind).is_file() else "are empty"
        fix = "tabulate again once it has finished" if state == "being written now" else \
            f"finish it with `{finish_command(derived, cast(DictConfig, OmegaConf.load(derived.config)))}`"
        out.append(f"{NOTE}: the quantization of {run.name} ({derived.path.name}, {state}): its quantization columns "
                   f"{shown}; {fix}.")
    return out


def split(runs: list[RunDir]) -> tuple[list[RunDir], list[str]]:
    """(the runs a leaderboard tabulates, its footnote lines on the runs that did not finish)."""
    kept, notes = [], []
    for run in runs:
        if note := unfinished(run):
            notes.append(note)
            continue
        kept.append(run)
        notes += unfinished_quantization(run)
    return kept, notes
