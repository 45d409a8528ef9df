"""Train, then evaluate: the one path a run takes, in this process (`launch`) or as a SLURM task (`run.slurm`).

With `eval.after_train=true` a finished run's `last.pt` gets the diagnostics and the linear and dense probes. With
several ranks every rank runs the probes (their collectives shard the work) and only rank 0 writes; the diagnostics
run on rank 0 alone, after the probes, so that no rank waits at a collective meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.schema import DataConfig
from vitsinks.configs.search import options
from vitsinks.data.datasets import with_masks
from vitsinks.diagnostics.page import REPORT
from vitsinks.run.diagnosed import diagnose_checkpoint, over_training
from vitsinks.run.probing import dense_probe, linear_probe
from vitsinks.train.trainer import Trainer
from vitsinks.utils.cpus import cpu_threads
from vitsinks.utils.distributed import rank_world, resolve_device
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import RunDir


def train_and_evaluate(trainer: Trainer) -> dict[str, Any]:
    """Fit `trainer` and, when it finished and `eval.after_train` is on, evaluate its last checkpoint; then rank 0
    writes the run's page over training. Returns the training summary."""
    summary = trainer.fit()
    cfg = trainer.cfg
    if summary["status"] == "finished" and cfg.eval.after_train:
        # "evaluating" until the probes are written: a sweep relaunch evaluates a run killed meanwhile (is_finished)
        if trainer.dist.is_main:
            trainer.write_status("evaluating")
        try:
            summary["after_train"] = after_train(cfg, trainer.run_dir)
        except BaseException as err:  # e.g. a full disk: the status says so, and a relaunch evaluates it again
            if trainer.dist.is_main:
                trainer.write_status("failed" if isinstance(err, Exception) else "interrupted", quiet=True,
                                     evaluated=False, error=" ".join(str(err).split()) or type(err).__name__)
            raise
        if trainer.dist.is_main:
            trainer.write_status("finished", evaluated=True)
    if trainer.dist.is_main and cfg.diagnostics.enabled and cfg.diagnostics.report and \
            RunDir(trainer.run_dir).diagnosed_steps():
        summary["page"] = str(run_page(trainer.run_dir, cfg))
    return summary


def run_page(run_dir: Path, cfg: DictConfig) -> Path:
    """The run's page over training (`diagnostics/report.html`) and its over-training plot and tables."""
    over_training(run_dir, cfg)
    return RunDir(run_dir).diagnostics_root / REPORT


def dense_data(cfg: DictConfig) -> DictConfig | None:
    """The after-training dense probe's data: `eval.dense_data`, else the training data with masks; None if none."""
    name = str(cfg.eval.dense_data or cfg.data.name)
    if name not in with_masks():
        if rank_world()[0] == 0:
            print(f"dense probe skipped: data={name} has no segmentation masks; set eval.dense_data=ade20k|voc (and "
                  f"eval.dense_root=...) to run it after training")
        return None
    if name == cfg.data.name:
        data = cfg.data
    else:
        found = options().get("data", {}).get(name)  # the user's config folders first, as `data=` reads them
        if found is None:
            raise BadValue(f"eval.dense_data={name} has no config file data/{name}.yaml: add it to your config folder "
                           f"(docs/extending.md#a-new-data-set)")
        preset = OmegaConf.load(found)
        root = None if OmegaConf.is_missing(preset, "root") else preset.root
        data = OmegaConf.merge(OmegaConf.structured(DataConfig), {k: v for k, v in preset.items() if k != "root"},
                               {"root": root})
    if cfg.eval.dense_root:
        data = OmegaConf.merge(data, {"root": cfg.eval.dense_root})
    return data


def after_train(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Diagnostics and probes of a finished run's `last.pt`; every rank calls it, rank 0 returns everything."""
    with cpu_threads(cfg, resolve_device(cfg.cluster.device)):  # the training's thread count (utils.cpus)
        out = probes(cfg, run_dir)
        if rank_world()[0] != 0:
            return out
        run = RunDir(run_dir)
        diag = diagnose_checkpoint(run.last, cfg, out_dir=run.diagnostics("final"))
    return {"sinks_per_image": diag["sinks_per_image"], **out}


def probes(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The linear probe (the training data) and the dense probe (`dense_data(cfg)`) of a run's `last.pt`."""
    out: dict[str, Any] = {}
    ev = cast(DictConfig, OmegaConf.merge(cfg, {"ckpt": str(RunDir(run_dir).last)}))  # a DictConfig with a mapping
    if cfg.data.num_classes == 0:  # e.g. the sink tasks' per-patch targets
        if rank_world()[0] == 0:
            print(f"linear probe skipped: data={cfg.data.name} has no class labels")
    else:
        out["linear"] = linear_probe(ev, cfg.data)["best"]
    data = dense_data(cfg)
    if data is not None:
        out["dense"] = {k: v for k, v in dense_probe(ev, data).items() if k in ("mIoU", "pixel_acc", "data")}
    return out
