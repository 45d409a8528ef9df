"""Main entry point.

    python -m vitsinks.launch exp=gate+reg [model=... data=... train=... cluster=...]     # one run
    python -m vitsinks.launch -m exp=base,gate,reg,gate+reg seed=0,1,2 cluster=slurm   # a sweep: one job array
    python -m vitsinks.launch status sweep=runs/sweeps/sweep-<id>                        # where a sweep stands
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from vitsinks import sweep as sw
from vitsinks.checkpoint import CheckpointMismatch
from vitsinks.config import config_dir, load_config, register_configs
from vitsinks.data import BadImage
from vitsinks.models import run_variant
from vitsinks.train import NonFiniteLoss, Trainer

log = logging.getLogger("vitsinks")

# Errors that mean "the input is wrong", not "vitsinks is broken": one readable line, non-zero exit.
USER_ERRORS = (FileNotFoundError, NotADirectoryError, CheckpointMismatch, NonFiniteLoss, BadImage, ValueError)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train one run in this process (rank layout from torchrun/SLURM variables) and return its summary."""
    trainer = Trainer(cfg)
    n = sum(p.numel() for p in trainer.model.backbone.parameters())
    if trainer.dist.is_main:
        print(f"vitsinks: {run_variant(cfg)} {cfg.model.size} ({n / 1e6:.2f}M parameters, "
              f"{trainer.model.backbone.tokens_per_image()} tokens per image) on {cfg.data.name}, "
              f"{trainer.total_steps} steps, device {trainer.device}, {trainer.dist.world} rank(s)")
        print(f"run directory: {trainer.run_dir}")
    summary = trainer.fit()
    if summary["status"] == "finished" and cfg.eval.after_train and trainer.dist.is_main:
        from vitsinks.eval import after_train

        summary["after_train"] = after_train(cfg, trainer.run_dir)
    if trainer.dist.is_main:
        val = ", ".join(f"{k} {v:.4f}" for k, v in summary.items() if k.startswith("val/"))
        print(f"{summary['status']} at step {summary['step']}: loss {summary.get('loss', float('nan')):.4f}"
              + (f", {val}" if val else ""))
        print(f"outputs: {trainer.run_dir}/config.yaml, metrics.jsonl, checkpoints/, diagnostics/")
        print(f"next: python -m vitsinks.diagnose run={trainer.run_dir}  (sinks over training); relaunch the same "
              f"command to resume or extend (train.epochs=...); other variants: exp=base|gate|reg|gate+reg")
    return summary


def _absolute(cfg: DictConfig) -> DictConfig:
    """Run directories as absolute paths (a SLURM job does not start where it was submitted)."""
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    cfg.runs_dir = str(Path(cfg.runs_dir).resolve())
    return cfg


def submit_one(cfg: DictConfig) -> None:
    from vitsinks import slurm

    cfg = _absolute(cfg)
    slurm.check_submittable(cfg)
    job = slurm.submit([cfg], slurm.logs_dir(cfg))[0]
    print(f"submitted SLURM job {job.job_id}: {cfg.name} -> {Path(cfg.runs_dir) / cfg.name}")
    print(f"logs: {job.paths.stdout}, {job.paths.stderr}")


def main(cfg: DictConfig) -> None:
    try:
        if cfg.cluster.name == "slurm":
            submit_one(cfg)
        else:
            run(cfg)
    except USER_ERRORS as err:
        _fail(err)


def _fail(err: BaseException) -> None:
    if os.environ.get("VITSINKS_TRACEBACK"):
        raise err
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


def multirun(overrides: list[str]) -> int:
    """Expand the sweep, skip finished runs, then run the rest here in turn or submit them as one job array."""
    combos = sw.expand(overrides)
    cfgs = [_absolute(load_config(o)) for o in combos]
    if len({c.cluster.name for c in cfgs}) != 1:
        raise ValueError("a sweep cannot mix clusters: give cluster=... once, not as a sweep")
    folder = sw.sweep_dir(cfgs[0].runs_dir, overrides)
    entries = [sw.entry(i, o, c) for i, (o, c) in enumerate(zip(combos, cfgs, strict=True))]
    todo = [i for i, e in enumerate(entries) if not sw.is_finished(Path(e["run_dir"]))]
    for i, e in enumerate(entries):
        e["cluster"] = cfgs[0].cluster.name
        e["job_id"] = None
        e["state"] = "pending" if i in todo else "finished (not relaunched)"
    meta = {"command": "python -m vitsinks.launch -m " + " ".join(overrides), "sweep_dir": str(folder)}
    manifest = folder / "sweep.json"
    failed = 0
    if cfgs[0].cluster.name == "slurm" and todo:
        from vitsinks import slurm

        slurm.check_submittable(cfgs[todo[0]])
        jobs = slurm.submit([cfgs[i] for i in todo], folder / "slurm")
        for i, job in zip(todo, jobs, strict=True):
            entries[i].update(job_id=job.job_id, state="submitted", stdout=str(job.paths.stdout),
                              stderr=str(job.paths.stderr))
        meta["array_job_id"] = jobs[0].job_id.split("_")[0]
        sw.write_manifest(manifest, entries, **meta)
        print(f"submitted {len(jobs)} runs as SLURM job array {meta['array_job_id']}")
    else:
        sw.write_manifest(manifest, entries, **meta)
        for i in todo:
            entries[i]["state"] = "running"
            sw.write_manifest(manifest, entries, **meta)
            try:
                entries[i]["state"] = run(cfgs[i])["status"]
            except USER_ERRORS as err:
                entries[i]["state"] = f"failed: {err}"
                failed += 1
            sw.write_manifest(manifest, entries, **meta)
    print(sw.table(entries, ["index", "job_id", "state", "run_dir"]))
    print(f"manifest: {manifest}\nstatus: python -m vitsinks.launch status sweep={folder}")
    return 1 if failed else 0


def status(sweep: str) -> int:
    """Each run of a sweep: SLURM state, step, last loss; the tail of the log for failures."""
    from vitsinks import slurm

    manifest = sw.read_manifest(sweep)
    folder = Path(manifest["sweep_dir"]) / "slurm"
    rows, failures = [], []
    for e in manifest["runs"]:
        state = sw.run_state(Path(e["run_dir"]))
        slurm_state = slurm.job_state(e["job_id"], folder) if e.get("job_id") else "-"
        loss = state.get("last_loss")
        rows.append({**e, "slurm": slurm_state, "run": state["status"],
                     "step": f"{state['step']}/{state.get('total_steps', '?')}",
                     "loss": f"{loss:.4f}" if loss is not None else "-"})
        if slurm_state in ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL") or \
                state["status"] == "failed":
            failures.append((e, slurm.log_tail(e["job_id"], folder) if e.get("job_id") else state.get("error", "")))
    print(sw.table(rows, ["index", "name", "job_id", "slurm", "run", "step", "loss"]))
    for e, tail in failures:
        print(f"\n--- {e['name']} ({e.get('job_id') or 'local'}) failed; last log lines:\n{tail}")
    return 0


register_configs()
hydra_main = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(main)


def cli(argv: list[str]) -> None:
    """Dispatch: `status`, `-m` sweeps (expanded here, so that SLURM gets one array), or one Hydra run."""
    try:
        if argv and argv[0] == "status":
            args = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
            if "sweep" not in args:
                raise ValueError("usage: python -m vitsinks.launch status sweep=<sweep folder>")
            sys.exit(status(args["sweep"]))
        if "-m" in argv or "--multirun" in argv:
            sys.exit(multirun([a for a in argv if a not in ("-m", "--multirun")]))
    except USER_ERRORS as err:
        _fail(err)
    hydra_main()


if __name__ == "__main__":
    cli(sys.argv[1:])
