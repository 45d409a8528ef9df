"""Sweeps: expanding `-m` overrides, the `sweep.json` manifest, and the state of each run."""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from vitsinks.tracking import read_metrics


def expand(overrides: list[str]) -> list[list[str]]:
    """Hydra's basic-sweeper semantics: the cartesian product of the comma lists / ranges / choices."""
    parsed = OverridesParser.create().parse_overrides(overrides)
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


def run_state(run_dir: Path) -> dict[str, Any]:
    """What a run directory says about itself: status, step, total steps, last loss."""
    info: dict[str, Any] = {"status": "pending", "step": 0}
    status = run_dir / "status.json"
    if status.exists():
        info.update(json.loads(status.read_text()))
    losses = [m for m in read_metrics(run_dir) if "loss" in m]
    if losses:
        info["last_loss"] = losses[-1]["loss"]
        info["step"] = max(info.get("step", 0), losses[-1]["step"])
    return info


def is_finished(run_dir: Path) -> bool:
    s = run_state(run_dir)
    return s["status"] == "finished" and s["step"] >= s.get("total_steps", 0)


def write_manifest(path: Path, entries: list[dict[str, Any]], **meta: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"updated": time.strftime("%Y-%m-%d %H:%M:%S"), **meta, "runs": entries}, indent=1))
    tmp.replace(path)


def read_manifest(sweep: str | Path) -> dict[str, Any]:
    path = Path(sweep)
    path = path / "sweep.json" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"no sweep manifest at {path}: pass the folder printed when the sweep was launched")
    return json.loads(path.read_text())


def entry(index: int, overrides: list[str], cfg: DictConfig) -> dict[str, Any]:
    run_dir = Path(cfg.runs_dir).resolve() / cfg.name
    return {"index": index, "overrides": overrides, "name": cfg.name, "exp": cfg.exp, "seed": cfg.seed,
            "run_dir": str(run_dir)}


def table(entries: list[dict[str, Any]], columns: list[str]) -> str:
    """Plain-text table of manifest entries."""
    rows = [[str(e.get(c, "")) for c in columns] for e in entries]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*columns)] + [fmt.format(*r) for r in rows])
