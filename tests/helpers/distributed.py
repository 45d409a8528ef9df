"""Functions run on several gloo ranks (fresh processes, a process group on 127.0.0.1), watched for progress."""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from vitsinks.utils.distributed import cleanup, init_distributed

DONE = "done"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(worker: Callable[..., None], rank: int, world: int, port: int, q: Any, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        init_distributed("cpu")
        q.put((rank, "joined the process group"))
        worker(rank, world, lambda what: q.put((rank, what)), *args)
        q.put((rank, DONE))
    except BaseException:
        q.put((rank, "error: " + traceback.format_exc()))
    finally:
        cleanup()


def run_ranks(worker: Callable[..., None], *args: Any, world: int = 2, stall_s: float = 90.0) -> list[tuple[int, str]]:
    """Run `worker(rank, world, report, *args)` on `world` gloo ranks (fresh processes); `report(what)` is its
    progress. Fails, killing the ranks, when a rank raises or dies, or when no rank reports progress for `stall_s`
    seconds (a hang). Returns the progress reports in the order they came."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(worker, r, world, port, q, args), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    reports: list[tuple[int, str]] = []
    done: set[int] = set()
    last = time.monotonic()
    try:
        while len(done) < world:
            try:
                rank, what = q.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in done and p.exitcode not in (None, 0)]
                if dead:
                    pytest.fail(f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode}) after {reports}")
                if time.monotonic() - last > stall_s:
                    pytest.fail(f"no rank made progress for {stall_s:.0f} s (a hang); progress so far: {reports}")
                continue
            last = time.monotonic()
            if what.startswith("error: "):
                pytest.fail(f"rank {rank} failed:\n{what[7:]}")
            reports.append((rank, what))
            if what == DONE:
                done.add(rank)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return reports
