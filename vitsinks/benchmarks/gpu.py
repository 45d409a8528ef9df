"""The GPU benchmark (docs/performance.md): the real training step of every variant on one GPU, and the data pipeline.

    python -m vitsinks.bench gpu [run] [budget_s=420] [out=gpu_bench.json]
    python -m vitsinks.bench gpu device=cpu size=vit_cpu img_size=32 batch=2    # a dry run of the whole path
    python -m vitsinks.bench gpu table out=gpu_bench.json [docs=docs/performance.md]

`run`: `Trainer.train_step` of the paper recipe for every `configs/exp` variant per size, eager and compiled (step time,
images/s, MFU, peak memory, compile time), then the loader's images/s per worker count; a task that would overrun
`budget_s` is skipped, `out` rewritten after every task; without CUDA (and `device` not `cpu`) it says so and exits 0.
`table`: the Markdown table of `out`, printed and, with `docs`, written between that file's gpu-bench markers.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from vitsinks.benchmarks.data import natural_image
from vitsinks.benchmarks.flops import meta_views, mfu, peak_tflops, step_flops
from vitsinks.benchmarks.gpu_report import render, update_docs
from vitsinks.configs.cli import parse_args
from vitsinks.configs.schema import exp_names, load_config
from vitsinks.data.crops import sample_seed
from vitsinks.models import SIZES
from vitsinks.train.trainer import Trainer
from vitsinks.utils import files
from vitsinks.utils.errors import ConfigError

USAGE = ("python -m vitsinks.bench gpu [run|table] [size=vit_large,vit_base] [batch=64] [steps=5] [warmup=3] "
         "[budget_s=S] [device=auto|cuda|cpu] [img_size=224] [variants=[...]] [modes=[eager,compiled]] [data=true] "
         "[workers=[...]] [overrides=[...]] [out=gpu_bench.json] [docs=FILE.md]")
MODES = ("eager", "compiled")
REFERENCE = "base"  # the variant every other one is compared with
DATA = "data"  # the data-pipeline task
JPEG_SIZES = ((500, 375), (375, 500))  # ImageNet's most common image sizes (landscape, portrait)


@dataclass
class GpuArgs:
    what: str = "run"  # run | table
    size: str = "vit_large,vit_base"  # comma-separated sizes, most important first
    batch: int = 64  # images per step (each with the recipe's views): the paper's global 256 on 4 GPUs
    steps: int = 5  # timed steps per row (median)
    warmup: int = 3  # untimed steps first (the first compiles)
    budget_s: float | None = None  # wall-time budget for the whole run (None: no limit)
    device: str = "auto"  # auto | cuda | cpu (cpu: a dry run of the whole path)
    img_size: int = 224
    variants: list[str] | None = None  # default: every configs/exp variant
    modes: list[str] = field(default_factory=lambda: list(MODES))
    data: bool = True  # the data-pipeline measurement
    workers: list[int] = field(default_factory=lambda: [0, 1, 2, 4, 8, 12])  # loader workers (capped at the CPUs)
    data_images: int = 1024  # JPEGs written for it
    data_batch: int = 32
    data_s: float = 6.0  # at most this long timed per worker count
    overrides: list[str] = field(default_factory=list)  # for every row's config, e.g. [train.grad_checkpointing=true]
    out: str = "gpu_bench.json"
    docs: str | None = None  # table: the Markdown file to update


@dataclass(frozen=True)
class Task:
    """One measurement: a (size, variant, mode) row, or the data pipeline (`exp == DATA`)."""

    size: str
    exp: str
    mode: str = "eager"


def plan(sizes: Sequence[str], variants: Sequence[str], modes: Sequence[str], data: bool = True) -> list[Task]:
    """The tasks, most important first: per size the reference, the others eager; data; the others compiled."""
    first = [v for v in variants if v == REFERENCE]
    others = [v for v in variants if v != REFERENCE]
    now: list[Task] = []
    later: list[Task] = []
    for size in sizes:
        now += [Task(size, v, m) for v in first for m in MODES if m in modes]
        now += [Task(size, v, "eager") for v in others if "eager" in modes]
        later += [Task(size, v, "compiled") for v in others if "compiled" in modes]
    return now + ([Task(sizes[0], DATA)] if data else []) + later


class Budget:
    """What is left of a wall-time budget (None: unlimited), and whether a task expected to take `estimate_s` fits."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.end = None if seconds is None else clock() + seconds

    def left(self) -> float:
        return float("inf") if self.end is None else self.end - self.clock()

    def allows(self, estimate_s: float | None) -> bool:
        """Unknown cost (None): whenever time is left."""
        return self.left() > (estimate_s or 0.0)


def estimate(task: Task, rows: Sequence[dict[str, Any]], args: GpuArgs) -> float | None:
    """Expected wall time of `task`: the last finished row's of its mode (and size, if any), else None."""
    if task.exp == DATA:
        return len(args.workers) * (args.data_s + 3.0) + args.data_images * 0.02  # + writing the JPEGs
    done = [r for r in rows if r["mode"] == task.mode and r["status"] == "ok"]
    same = [r for r in done if r["size"] == task.size]
    return (same or done)[-1]["wall_s"] if done else None


def bench_config(size: str, exp: str, compiled: bool, batch: int, args: GpuArgs, device: str, runs_dir: str,
                 data: Sequence[str] = ("data.num_workers=0",)) -> DictConfig:
    """The paper recipe's run config of one row (`data`: the data settings, default synthetic images)."""
    s = args.img_size
    return load_config(["recipe=paper", f"exp={exp}", f"model={size}", f"model.img_size={s}", f"views.global_size={s}",
                        f"data.image_size={s}", f"train.batch_size={batch}", f"train.compile={compiled}",
                        f"cluster.device={device}", "wandb.mode=disabled", f"runs_dir={runs_dir}", *data,
                        *args.overrides])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_row(task: Task, args: GpuArgs, device: str, runs_dir: str, batches: dict[str, Any],
                flops: dict[tuple[str, str], int], peak: float | None) -> dict[str, Any]:
    """Time `args.steps` training steps of `task` after `args.warmup` untimed ones on one real batch."""
    t0 = time.perf_counter()
    cfg = bench_config(task.size, task.exp, task.mode == "compiled", args.batch, args, device, runs_dir)
    trainer = Trainer(cfg)
    dev = trainer.device
    built = time.perf_counter()
    if "batch" not in batches:  # the recipe's views are the same for every variant: one batch for all rows
        batches["batch"] = next(iter(trainer.loader(0)))[:2]
    inputs, targets = batches["batch"]
    key = (task.size, task.exp)
    if key not in flops:  # the model's FLOPs: on plain views (a views.backend=device batch's augmentation is not)
        flops[key] = step_flops(cfg, *meta_views(cfg, args.batch), trainer.num_classes)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(args.warmup + args.steps):
        _sync(dev)
        s = time.perf_counter()
        trainer.train_step(inputs, targets)
        _sync(dev)
        times.append(time.perf_counter() - s)
    trainer.check_flags()  # a non-finite loss in any step is an error, not a timing
    timed = sorted(times[args.warmup:])
    step = statistics.median(timed)
    q = statistics.quantiles(timed, n=4) if len(timed) > 1 else [step, step, step]
    m = cfg.model
    arch = {"attn": str(m.attn), "gate": str(m.gate), "registers": int(m.registers),
            "pathway": bool(m.global_pathway.enabled), "cm_penalty": float(cfg.objective.cm_penalty)}
    row = {"size": task.size, "exp": task.exp, "mode": task.mode, "status": "ok", "arch": arch,
           "batch": args.batch, "views": cfg.views.n_global + cfg.views.n_local,
           "tokens": trainer.backbone.tokens_per_image(), "step_ms": step * 1e3,
           "step_ms_iqr": [q[0] * 1e3, q[2] * 1e3], "images_per_s": args.batch / step,
           "flops_per_step": flops[key], "tflops_per_s": flops[key] / step / 1e12,
           "mfu": mfu(flops[key], step, peak),
           "peak_mem_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
           "first_step_s": times[0], "compile_s": times[0] - step if task.mode == "compiled" else None,
           "build_s": built - t0}
    del trainer
    row["wall_s"] = time.perf_counter() - t0
    return row


def write_jpegs(root: Path, n: int, classes: int = 8, seed: int = 0) -> dict[str, Any]:
    """`n` photo-like JPEGs in ImageFolder layout under `root/train` (`root/val`: its class folders, empty)."""
    total = 0
    for c in range(classes):
        (root / "val" / f"c{c}").mkdir(parents=True, exist_ok=True)
        (root / "train" / f"c{c}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        w, h = JPEG_SIZES[i % len(JPEG_SIZES)]
        path = root / "train" / f"c{i % classes}" / f"{i:05d}.JPEG"
        natural_image(sample_seed(seed, i), w, h).save(path, quality=90)
        total += path.stat().st_size
    return {"files": n, "sizes": [list(s) for s in JPEG_SIZES], "mean_kb": total / max(n, 1) / 1e3}


def time_loader(loader: Iterable[Any], warm: int, cap_s: float) -> tuple[int, float]:
    """(images, seconds) of the batches after the first `warm`, timed for at most `cap_s` seconds."""
    images, start, now = 0, None, 0.0
    for i, (_, targets, _) in enumerate(loader):
        now = time.perf_counter()
        if start is not None:
            images += len(targets)
            if now - start > cap_s:
                break
        elif i + 1 >= warm:
            start = now
    return images, (now - start) if start is not None else 0.0


def measure_data(args: GpuArgs, device: str, runs_dir: str, report: Callable[[dict[str, Any]], None]) -> None:
    """The training loader's images/s per worker count on page-cached JPEGs (`report` gets each row)."""
    cpus = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "jpegs"
        report({"jpegs": write_jpegs(root, args.data_images), "cpus": cpus})
        for w in sorted({min(w, cpus) for w in args.workers}):
            cfg = bench_config("vit_cpu", REFERENCE, False, args.data_batch, args, device, runs_dir,
                               ("data=imagenet", f"data.root={root}", f"data.num_workers={w}"))
            trainer = Trainer(cfg)
            images, seconds = time_loader(trainer.loader(0), max(1, w), args.data_s)
            views = cfg.views.n_global + cfg.views.n_local
            rate = images / seconds if seconds > 0 else None
            report({"workers": w, "backend": str(cfg.views.backend), "images": images, "seconds": seconds,
                    "images_per_s": rate, "views_per_s": None if rate is None else rate * views})
            del trainer


def _cleanup() -> None:
    gc.collect()
    torch._dynamo.reset()  # each row compiles a new model: without a reset the recompile limit falls back to eager
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _check(args: GpuArgs) -> tuple[list[str], list[str]]:
    sizes = [s for s in args.size.split(",") if s]
    variants = list(args.variants) if args.variants is not None else exp_names()
    problems = [f"size {s!r} (choose from {', '.join(SIZES)})" for s in sizes if s not in SIZES]
    problems += [f"variant {v!r} (choose from {', '.join(exp_names())})" for v in variants if v not in exp_names()]
    problems += [f"mode {m!r} (choose from {', '.join(MODES)})" for m in args.modes if m not in MODES]
    if args.what not in ("run", "table"):
        problems.append(f"command {args.what!r} (choose run or table)")
    if args.device not in ("auto", "cuda", "cpu"):
        problems.append(f"device={args.device} (choose auto, cuda or cpu)")
    for name in ("batch", "steps", "warmup", "img_size", "data_images", "data_batch"):
        if getattr(args, name) < 1:
            problems.append(f"{name}={getattr(args, name)} (must be >= 1)")
    if args.budget_s is not None and args.budget_s <= 0:
        problems.append(f"budget_s={args.budget_s} (must be > 0, or null for no limit)")
    if not sizes:
        problems.append("size is empty (e.g. size=vit_large,vit_base)")
    if problems:
        raise ConfigError("bench gpu: bad " + "; ".join(problems))
    return sizes, variants


def bench(args: GpuArgs) -> dict[str, Any] | None:
    """Run (or, for `table`, render) the benchmark of `args`; None when skipped for want of CUDA."""
    sizes, variants = _check(args)
    tasks = plan(sizes, variants, args.modes, args.data)
    out = Path(args.out)
    if args.what == "table":
        results = json.loads(out.read_text()) if out.exists() else planned(tasks, args)
        text = render(results)
        if args.docs:
            update_docs(Path(args.docs), text)
        print(text)
        return results
    if args.device != "cpu" and not torch.cuda.is_available():
        print("bench gpu skipped: no CUDA device here (torch.cuda.is_available() is False); device=cpu runs a dry "
              "run of the whole path on the CPU")
        return None
    device = "cuda" if args.device == "auto" else args.device
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = peak_tflops(name) if device == "cuda" else None
    results = planned(tasks, args)
    results["meta"].update(device=name, peak_bf16_tflops=peak, torch=torch.__version__, cuda=torch.version.cuda,
                           started=datetime.now(UTC).isoformat(timespec="seconds"), status="running",
                           peak_note=None if peak is not None else f"no bf16 peak known for {name!r}: MFU null")
    rows: list[dict[str, Any]] = results["rows"]
    budget = Budget(args.budget_s)
    batches: dict[str, Any] = {}
    flop_cache: dict[tuple[str, str], int] = {}
    files.write_json(out, results)

    def report(item: dict[str, Any]) -> None:  # the data task's rows, as they come
        if "workers" in item:
            results["data"].append(item)
        else:
            results["meta"]["data"] = item
        files.write_json(out, results)
        print(f"data: {item}", flush=True)

    with tempfile.TemporaryDirectory() as runs_dir:
        for i, task in enumerate(tasks):
            guess = estimate(task, [r for r in rows if r["status"] == "ok"], args)
            if not budget.allows(guess):
                _set(rows, i, task, {"status": "skipped (budget)", "expected_s": guess})
                files.write_json(out, results)
                continue
            if task.exp == DATA:
                _run_safely(lambda: measure_data(args, device, runs_dir, report), rows, i, task)
            else:
                _run_safely(functools.partial(measure_row, task, args, device, runs_dir, batches, flop_cache, peak),
                            rows, i, task)
            _cleanup()
            files.write_json(out, results)
            print(_line(rows[i]), flush=True)
    results["meta"].update(status="finished", finished=datetime.now(UTC).isoformat(timespec="seconds"))
    files.write_json(out, results)
    print(render(results))
    return results


def _run_safely(fn: Callable[[], dict[str, Any] | None], rows: list[dict[str, Any]], i: int, task: Task) -> None:
    """Run one task; an out-of-memory or any other failure becomes the row's status (the next task still runs)."""
    start = time.perf_counter()
    try:
        row = fn()
        _set(rows, i, task, row if row is not None else {"status": "ok", "wall_s": time.perf_counter() - start})
    except torch.cuda.OutOfMemoryError:
        _set(rows, i, task, {"status": "out of memory", "wall_s": time.perf_counter() - start})
    except Exception as err:  # noqa: BLE001 - one failed row must not cost the rest of the lease
        traceback.print_exc()
        message = " ".join(str(err).split())[:200]
        _set(rows, i, task, {"status": f"error: {type(err).__name__}: {message}",
                             "wall_s": time.perf_counter() - start})


def _set(rows: list[dict[str, Any]], i: int, task: Task, values: dict[str, Any]) -> None:
    rows[i] = {"size": task.size, "exp": task.exp, "mode": task.mode, **values}


def _line(row: dict[str, Any]) -> str:
    name = "data pipeline" if row["exp"] == DATA else f"{row['size']} {row['exp']} {row['mode']}"
    if row["status"] != "ok" or "step_ms" not in row:
        return f"{name}: {row['status']} ({row.get('wall_s', 0):.0f} s)"
    mfu = "" if row["mfu"] is None else f", MFU {row['mfu']:.1%}"
    return (f"{name}: {row['step_ms']:.1f} ms/step, "
            f"{row['images_per_s']:.0f} images/s{mfu} ({row['wall_s']:.0f} s)")


def planned(tasks: Sequence[Task], args: GpuArgs) -> dict[str, Any]:
    """The results of a run of `tasks` that measured nothing yet: every row `unmeasured`."""
    meta = {"schema": 1, "device": None, "peak_bf16_tflops": None, "recipe": "paper", "batch": args.batch,
            "img_size": args.img_size, "warmup": args.warmup, "steps": args.steps, "budget_s": args.budget_s,
            "overrides": list(args.overrides), "status": "unmeasured"}
    return {"meta": meta, "rows": [{"size": t.size, "exp": t.exp, "mode": t.mode, "status": "unmeasured"}
                                   for t in tasks], "data": []}


def gpu_command(argv: Sequence[str]) -> int:
    args = parse_args(argv, GpuArgs, USAGE, positional="what")
    bench(args)  # type: ignore[arg-type]
    return 0

