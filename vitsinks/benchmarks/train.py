"""`python -m vitsinks.bench train`: where a train step's time goes on vit_cpu, and view-generation throughput."""

from __future__ import annotations

import statistics
import time
from typing import cast

import torch
from torch.utils.data import Dataset

from vitsinks.benchmarks.timing import interleaved, ratio_stats, table
from vitsinks.configs.schema import load_config
from vitsinks.data.crops import SeededViews
from vitsinks.data.synthetic_images import SyntheticShapes
from vitsinks.objectives.lejepa import LeJEPA
from vitsinks.train.trainer import Trainer


def _phases(trainer: Trainer, views: list[torch.Tensor], labels: torch.Tensor) -> dict[str, float]:
    """One instrumented train step (LeJEPA): seconds spent in forward, loss, backward, optimizer; SIGReg alone."""
    n_global = trainer.cfg.views.n_global
    loss = cast(LeJEPA, trainer.objective).loss
    t = [time.perf_counter()]
    proj_g, proj_l, logits = trainer.model(views, n_global)
    t.append(time.perf_counter())
    terms = loss(proj_g, proj_l)
    total = terms.loss + torch.nn.functional.cross_entropy(logits, labels.repeat(n_global))
    t.append(time.perf_counter())
    trainer.optimizer.zero_grad(set_to_none=True)
    total.backward()
    t.append(time.perf_counter())
    trainer.optimizer.step()
    trainer.scheduler.step()
    t.append(time.perf_counter())
    # SIGReg alone (forward + backward) on the same projections
    all_proj = torch.cat([proj_g, proj_l]).detach().requires_grad_(True)
    s0 = time.perf_counter()
    loss.sigreg(all_proj).backward()
    sig = time.perf_counter() - s0
    return {"forward": t[1] - t[0], "loss": t[2] - t[1], "backward": t[3] - t[2], "optimizer": t[4] - t[3],
            "sigreg": sig}


def run(batch: int = 64, repeats: int = 10) -> str:
    """Return the step-time split and the view-throughput ratio."""
    cfg = load_config([f"train.batch_size={batch}", "wandb.mode=disabled", "runs_dir=/nonexistent-bench"])
    trainer = Trainer(cfg)
    loader = iter(trainer.loader(0))
    rows: dict[str, list[float]] = {}
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        views, labels, _ = next(loader)
        data = time.perf_counter() - t0
        phases = {"data": data, **_phases(trainer, views, labels)}
        if r:  # first step is warm-up
            for k, v in phases.items():
                rows.setdefault(k, []).append(v)
    med = {k: statistics.median(v) for k, v in rows.items()}
    step = sum(med[k] for k in ("data", "forward", "loss", "backward", "optimizer"))
    split = [[k, f"{med[k] * 1e3:.1f}", f"{med[k] / step:.1%}"] for k in
             ("data", "forward", "loss", "backward", "optimizer")]
    sig = med["sigreg"]
    split.append(["(SIGReg fwd+bwd, inside loss+backward)", f"{sig * 1e3:.1f}", f"{sig / step:.1%}"])

    # views: our seeded pipeline vs lightly's transform called directly on the same images
    base = SyntheticShapes(cfg.data.image_size, 64, cfg.data.num_classes)
    images = [base[i][0] for i in range(len(base))]
    tf = cast(SeededViews, trainer.train_set).transform  # LeJEPA's training items
    ours = SeededViews(cast(Dataset, [(im, 0) for im in images]), tf, seed=0)  # pre-decoded: only the views timed
    times = interleaved({"lightly": lambda: [tf(im) for im in images],
                         "vitsinks": lambda: [ours[i] for i in range(len(images))]}, repeats=repeats)
    med_r, lo, hi = ratio_stats(times["lightly"], times["vitsinks"])
    return (f"train step on {cfg.model.size}, batch {batch}, {cfg.views.n_global} global {cfg.views.global_size}px + "
            f"{cfg.views.n_local} local {cfg.views.local_size}px views (median of {repeats} steps)\n\n"
            + table(split, ["phase", "ms", "share of step"])
            + f"\n\nview generation throughput, vitsinks pipeline / lightly transform called directly: {med_r:.3f} "
              f"(IQR {lo:.3f}-{hi:.3f}; target >= 0.95)")
