"""Train: one run, a sweep of runs (`-m`, here or as one SLURM job array), or where a sweep stands (`status`).

    python -m vitsinks.launch exp=gate+reg [model=... data=... train=... cluster=...]     # one run
    python -m vitsinks.launch -m exp=base,gate,reg,gate+reg seed=0,1,2 cluster=slurm   # a sweep: one job array
    python -m vitsinks.launch -m study=paper_gate_reg data.root=... cluster=<yours>     # a study: a named sweep
    python -m vitsinks.launch status sweep=runs/sweeps/sweep-<id>                        # where a sweep stands
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.cli import compose, fail, guarded, hydra_command, parse_args
from vitsinks.configs.schema import to_container
from vitsinks.configs.usage import command_help, wants_help
from vitsinks.models import run_variant
from vitsinks.run import slurm
from vitsinks.run import sweep as sw
from vitsinks.run.pipeline import train_and_evaluate
from vitsinks.train.trainer import Trainer
from vitsinks.utils.errors import ConfigError, UserError
from vitsinks.utils.metrics_log import read_metrics
from vitsinks.utils.runstate import read_manifest, write_manifest


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train (then, with `eval.after_train`, evaluate) one run in this process and return its summary."""
    trainer = Trainer(cfg)
    n = sum(p.numel() for p in trainer.backbone.parameters())
    if trainer.dist.is_main:
        print(f"vitsinks: {run_variant(cfg)} {cfg.model.size} ({n / 1e6:.2f}M parameters, "
              f"{trainer.backbone.tokens_per_image()} tokens per image) on {cfg.data.name}, "
              f"{trainer.total_steps} steps, device {trainer.device}"
              + (f" ({trainer.cpu_threads} thread{'s' * (trainer.cpu_threads > 1)})" * (trainer.device.type == "cpu"))
              + f", {trainer.dist.world} rank(s)")
        print(f"run directory: {trainer.run_dir}")
    summary = train_and_evaluate(trainer)
    if trainer.dist.is_main:
        print("\n".join(closing_lines(cfg, trainer, summary)))
    return summary


def closing_lines(cfg: DictConfig, trainer: Trainer, summary: dict[str, Any]) -> list[str]:
    """The three lines a run ends with: what it trained, its headline numbers, where its page is."""
    metrics = [m for m in read_metrics(trainer.run_dir) if "loss" in m]
    loss = (f", loss {metrics[0]['loss']:.3f} at step {metrics[0]['step']} -> {metrics[-1]['loss']:.3f}"
            if metrics else "")
    trained = (f"trained {run_variant(cfg)} {cfg.model.size} on {cfg.data.name}, seed {cfg.seed}: "
               f"{summary['status']} at step {summary['step']}/{trainer.total_steps}{loss}")
    after = summary.get("after_train", {})
    numbers = [f"online probe {100 * v:.1f}%" for k, v in summary.items() if k == "val/probe_acc"]
    if "linear" in after:
        numbers.append(f"linear probe {after['linear']['top1']:.1f}%")
    if "dense" in after:
        numbers.append(f"mIoU {100 * after['dense']['mIoU']:.1f} ({after['dense']['data']}, {cfg.eval.dense_protocol} "
                       f"dense probe)")
    if "sinks_per_image" in after:
        sinks = after["sinks_per_image"]
        numbers.append(f"sink events per image {sinks['all']['all']:.2f} (NOP {sinks['nop']['all']:.2f}, "
                       f"broadcast {sinks['broadcast']['all']:.2f})")
    if "after_train" not in summary:
        numbers.append("no probes after training (" + ("eval.after_train=false)" if summary["status"] == "finished"
                                                        else "the run did not finish)"))
    page = summary.get("page")
    where = f"page: {page}" if page else f"run: {trainer.run_dir} (no page: diagnostics.report=false)"
    return [trained, "; ".join(numbers), where]


def _absolute(cfg: DictConfig) -> DictConfig:
    """A plain resolved copy with an absolute runs_dir (a SLURM job does not start where it was submitted)."""
    cfg = OmegaConf.create(to_container(cfg))
    cfg.runs_dir = str(Path(cfg.runs_dir).resolve())
    return cfg


def single(cfg: DictConfig) -> None:
    """One run: here, or submitted as one SLURM job."""
    if cfg.cluster.name != "slurm":
        run(cfg)
        return
    cfg = _absolute(cfg)
    slurm.check_submittable(cfg)
    job = slurm.submit([cfg], slurm.logs_dir(cfg))[0]
    print(f"submitted SLURM job {job.job_id}: {cfg.name} -> {Path(cfg.runs_dir) / cfg.name}")
    print(f"logs: {job.paths.stdout}, {job.paths.stderr}")


def study_sweep(overrides: list[str]) -> list[str]:
    """The overrides with `study=<name>` replaced by its `hydra.sweeper.params` (the command line wins)."""
    chosen = [o for o in overrides if o.split("=", 1)[0] == "study"]
    if not chosen:
        return list(overrides)
    if len(chosen) > 1 or "," in chosen[0]:
        raise ConfigError(f"one study per sweep, got {' '.join(chosen)}")
    params = OmegaConf.select(compose(chosen, False, True), "hydra.sweeper.params") or {}
    if not params:
        raise ConfigError(f"{chosen[0]} sweeps nothing: a study sets hydra.sweeper.params (configs/README.md)")
    merged = {str(k): f"{k}={v}" for k, v in params.items()}
    for o in overrides:
        if o not in chosen:
            merged[o.split("=", 1)[0].lstrip("+~")] = o
    return list(merged.values())


def multirun(overrides: list[str]) -> int:
    """Expand the sweep, skip finished runs, then run the rest here in turn or submit them as one job array."""
    overrides = study_sweep(overrides)
    combos = sw.expand(overrides)
    cfgs = [_absolute(compose(o)) for o in combos]
    if len({c.cluster.name for c in cfgs}) != 1:
        raise ConfigError("a sweep cannot mix clusters: give cluster=... once, not as a sweep")
    sw.name_runs(combos, cfgs)
    folder = sw.sweep_dir(cfgs[0].runs_dir, overrides)
    manifest = folder / "sweep.json"
    old = read_manifest(manifest) if manifest.is_file() else None
    entries = [sw.entry(i, o, c) for i, (o, c) in enumerate(zip(combos, cfgs, strict=True))]
    todo = [i for i, c in enumerate(cfgs) if not sw.is_finished(Path(entries[i]["run_dir"]), c)]
    meta = sw.carry_over(old, entries, todo, cfgs[0].cluster.name)
    meta.update(command="python -m vitsinks.launch -m " + " ".join(overrides), sweep_dir=str(folder))
    failed = 0
    if cfgs[0].cluster.name == "slurm":
        slurm.check_submittable(cfgs[todo[0] if todo else 0])
        if todo:
            jobs = slurm.submit([cfgs[i] for i in todo], folder / "slurm", name=f"vitsinks-{folder.name}")
            for i, job in zip(todo, jobs, strict=True):
                entries[i].update(job_id=job.job_id, state="submitted", stdout=str(job.paths.stdout),
                                  stderr=str(job.paths.stderr))
            meta["array_job_id"] = jobs[0].job_id.split("_")[0]
            print(f"submitted {len(jobs)} runs as SLURM job array {meta['array_job_id']}")
        write_manifest(manifest, entries, **meta)
    else:
        write_manifest(manifest, entries, **meta)
        for i in todo:
            entries[i]["state"] = "running"
            write_manifest(manifest, entries, **meta)
            try:
                entries[i]["state"] = run(cfgs[i])["status"]
            except UserError as err:  # this run's input is wrong: say so and go on with the others
                entries[i]["state"] = f"failed: {' '.join(str(err).split())}"
                print(f"error: {entries[i]['name']}: {entries[i]['state'][8:]}", file=sys.stderr)
                failed += 1
            write_manifest(manifest, entries, **meta)
    print(sw.table(entries, ["index", "job_id", "state", "run_dir"]))
    print(f"manifest: {manifest}\nstatus: python -m vitsinks.launch status sweep={folder}")
    return 1 if failed else 0


def status(sweep: str) -> int:
    """Each run of a sweep (SLURM state, step, last loss) and each failure's log tail; 1 if any failed or was killed."""
    manifest = read_manifest(sweep)
    folder = Path(manifest["sweep_dir"]) / "slurm"
    rows, failures, notes = [], [], []
    for e in manifest["runs"]:
        state = sw.run_state(Path(e["run_dir"]))
        slurm_state = slurm.job_state(e["job_id"], folder, state) if e.get("job_id") else "-"
        loss = state.get("last_loss")
        rows.append({**e, "slurm": slurm_state, "run": state["status"],
                     "step": f"{state['step']}/{state.get('total_steps', '?')}",
                     "loss": f"{loss:.4f}" if loss is not None else "-"})
        if slurm_state in slurm.FAILED_STATES or state["status"] in ("failed", "killed") or \
                str(e.get("state", "")).startswith("failed"):
            failures.append((e, state))
        elif state.get("note"):
            notes.append(f"{e['name']}: {state['status']} ({state['note']})")
    print(sw.table(rows, ["index", "name", "job_id", "slurm", "run", "step", "loss"]))
    for line in notes:
        print(line)
    for e, state in failures:
        what = f"killed ({state['note']}): relaunch the sweep to resume it" if state["status"] == "killed" else "failed"
        tail = slurm.log_tail(e["job_id"], folder) if e.get("job_id") else state.get("error") or e.get("state", "")
        print(f"\n--- {e['name']} ({e.get('job_id') or 'local'}) {what}; last log lines:\n{tail}"
              if tail else f"\n--- {e['name']} ({e.get('job_id') or 'local'}) {what}")
    return 1 if failures else 0


def status_command(args: Sequence[str]) -> int:
    """Where a sweep stands: every run's SLURM state, step / total steps and last loss, and the log tail of each
    failure; exit 1 when a run failed.

    python -m vitsinks.launch status sweep=runs/sweeps/sweep-<id>   # the sweep's folder (or its sweep.json)"""
    usage = "python -m vitsinks.launch status sweep=<sweep folder>"
    parsed = parse_args(args, {"sweep": None}, usage)
    if not parsed.sweep:
        raise ConfigError(f"no sweep given; usage: {usage}")
    return status(parsed.sweep)


def cli(argv: Sequence[str]) -> None:
    """Dispatch: `status`, `-m` sweeps (expanded here, so that SLURM gets one array), or one Hydra run."""
    argv = list(argv)
    if wants_help(argv):  # `python -m` answers it before this module is imported (vitsinks/__init__.py)
        print(command_help("vitsinks.launch", argv))
        return
    if argv and argv[0] == "status":
        sys.exit(guarded(status_command, argv[1:]))
    if "-m" in argv or "--multirun" in argv:
        sys.exit(guarded(multirun, [a for a in argv if a not in ("-m", "--multirun")]))
    study = next((a for a in argv if a.startswith("study=")), None)
    if study:  # a study is a sweep (Hydra's sweeper params): it runs under -m only
        fail(ConfigError(f"{study} is a sweep: run it with -m (python -m vitsinks.launch -m {study} ...)"))
    hydra_command(single)(argv)


if __name__ == "__main__":
    cli(sys.argv[1:])
