"""The GPU benchmark's plan, budget and incremental JSON, its skip without CUDA, and a CPU dry run end to end."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.commands import run_commands, run_module
from vitsinks.benchmarks import gpu
from vitsinks.benchmarks.gpu import DATA, Budget, GpuArgs, Task, estimate, plan
from vitsinks.benchmarks.gpu_report import END, START
from vitsinks.configs.schema import exp_names
from vitsinks.utils.errors import ConfigError


def test_the_plan_runs_the_most_important_rows_first_and_every_row_once() -> None:
    variants = exp_names()
    tasks = plan(["vit_large", "vit_base"], variants, ["eager", "compiled"])
    others = [v for v in variants if v != "base"]
    assert tasks[:2] == [Task("vit_large", "base", "eager"), Task("vit_large", "base", "compiled")]
    assert tasks[2 : 2 + len(others)] == [Task("vit_large", v, "eager") for v in others]
    b = 2 + len(others)
    assert tasks[b : b + 2] == [Task("vit_base", "base", "eager"), Task("vit_base", "base", "compiled")]
    data = tasks.index(Task("vit_large", DATA))
    assert data == 2 * b  # after every eager row and the compiled references, before the other compiled rows
    assert tasks[data + 1 :] == [Task(s, v, "compiled") for s in ("vit_large", "vit_base") for v in others]
    rows = [t for t in tasks if t.exp != DATA]
    assert len(rows) == len(set(rows)) == 2 * 2 * len(variants)


def test_the_variants_default_to_the_exp_registry_and_bad_arguments_are_named() -> None:
    assert gpu._check(GpuArgs()) == (["vit_large", "vit_base"], exp_names())
    with pytest.raises(ConfigError, match="variant 'nope'"):
        gpu._check(GpuArgs(variants=["base", "nope"]))
    with pytest.raises(ConfigError, match="size 'vit_xxl'.*mode 'jit'"):
        gpu._check(GpuArgs(size="vit_xxl", modes=["jit"]))


def test_the_budget_admits_a_task_only_when_its_expected_time_is_left() -> None:
    now = [0.0]
    budget = Budget(10.0, clock=lambda: now[0])
    assert budget.allows(None) and budget.allows(9.9) and not budget.allows(10.1)
    now[0] = 9.0
    assert budget.left() == 1.0 and not budget.allows(2.0) and budget.allows(None)
    now[0] = 10.5
    assert not budget.allows(None)
    assert Budget(None).allows(1e9)
    rows = [{"size": "vit_large", "mode": "eager", "status": "ok", "wall_s": 7.0},
            {"size": "vit_large", "mode": "compiled", "status": "ok", "wall_s": 70.0},
            {"size": "vit_large", "mode": "eager", "status": "ok", "wall_s": 9.0}]
    assert estimate(Task("vit_large", "gate", "eager"), rows, GpuArgs()) == 9.0  # the last of its size and mode
    assert estimate(Task("vit_large", "gate", "compiled"), rows, GpuArgs()) == 70.0
    assert estimate(Task("vit_base", "gate", "eager"), rows, GpuArgs()) == 9.0  # none at its size: the larger's
    assert estimate(Task("vit_base", "gate", "eager"), rows[1:2], GpuArgs()) is None  # none of its mode


def test_rows_are_written_as_they_finish_and_the_budget_skips_the_rest(tmp_path: Path, monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr(gpu, "Budget", lambda seconds: Budget(seconds, clock=lambda: now[0]))
    out = tmp_path / "bench.json"
    seen_on_disk = []

    def fake_row(task: Task, *args: object) -> dict:
        seen_on_disk.append([r["status"] for r in json.loads(out.read_text())["rows"]])
        now[0] += 4.0
        return {"size": task.size, "exp": task.exp, "mode": task.mode, "status": "ok", "wall_s": 4.0,
                "arch": {}, "step_ms": 10.0, "images_per_s": 1.0, "flops_per_step": 1.0, "tflops_per_s": 0.0,
                "mfu": None, "peak_mem_gib": None}

    monkeypatch.setattr(gpu, "measure_row", fake_row)
    res = gpu.bench(GpuArgs(device="cpu", size="vit_cpu", variants=["base", "gate", "reg"], data=False,
                            budget_s=10.0, out=str(out)))
    # base eager (0 -> 4 s) and base compiled (no estimate yet, 4 -> 8 s) ran; gate eager is expected to take 4 s
    # with 2 s left, and so is every later row
    assert seen_on_disk == [["unmeasured"] * 6, ["ok"] + ["unmeasured"] * 5]
    on_disk = json.loads(out.read_text())
    assert on_disk == res and on_disk["meta"]["status"] == "finished"
    assert [(r["exp"], r["mode"], r["status"]) for r in on_disk["rows"]] == [
        ("base", "eager", "ok"), ("base", "compiled", "ok"), ("gate", "eager", "skipped (budget)"),
        ("reg", "eager", "skipped (budget)"), ("gate", "compiled", "skipped (budget)"),
        ("reg", "compiled", "skipped (budget)")]


def test_a_failing_row_is_recorded_and_the_next_one_runs(tmp_path: Path, monkeypatch) -> None:
    def flaky(task: Task, *args: object) -> dict:
        if task.exp == "gate":
            raise RuntimeError("kernel exploded\nsecond line")
        return {"size": task.size, "exp": task.exp, "mode": task.mode, "status": "ok", "wall_s": 1.0, "arch": {},
                "step_ms": 1.0, "images_per_s": 1.0, "flops_per_step": 1.0, "tflops_per_s": 0.0, "mfu": None,
                "peak_mem_gib": None}

    monkeypatch.setattr(gpu, "measure_row", flaky)
    res = gpu.bench(GpuArgs(device="cpu", size="vit_cpu", variants=["base", "gate", "reg"], modes=["eager"],
                            data=False, out=str(tmp_path / "b.json")))
    assert [r["status"] for r in res["rows"]] == ["ok", "error: RuntimeError: kernel exploded second line", "ok"]


def test_without_cuda_it_says_why_and_touches_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu, "measure_row", lambda *a: pytest.fail("measured without CUDA"))
    assert gpu.bench(GpuArgs(out=str(tmp_path / "out.json"))) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench gpu skipped: no CUDA device")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_command_without_cuda_exits_0_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, also on a machine that has one
    commands = [[sys.executable, *argv] for argv in (["-m", "vitsinks.bench", "gpu"],
                                                       ["-m", "vitsinks.bench", "gpu", f"out={tmp_path / 'x.json'}"])]
    for done in run_commands(commands, cwd=tmp_path, env=env):
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("bench gpu skipped: no CUDA device") and done.stdout.count("\n") == 1
        assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_cpu_dry_run_measures_every_task_and_renders_the_docs_table(tmp_path: Path) -> None:
    out, doc = tmp_path / "bench.json", tmp_path / "perf.md"
    done = run_module("vitsinks.bench", "gpu", "device=cpu", "size=vit_cpu", "img_size=32", "batch=2", "steps=2",
                      "warmup=1", "modes=[eager]", "variants=[base,gate]", "workers=[0,1]", "data_images=8",
                      "data_batch=2", "data_s=5", "overrides=[model.depth=2,objective.proj_hidden=64]",
                      f"out={out}")
    assert done.returncode == 0, done.stderr
    res = json.loads(out.read_text())
    assert res["meta"]["status"] == "finished" and res["meta"]["device"] == "cpu"
    assert [(r["exp"], r["status"]) for r in res["rows"]] == [("base", "ok"), ("gate", "ok"), ("data", "ok")]
    base, gate = res["rows"][:2]
    assert gate["flops_per_step"] > base["flops_per_step"] > 0  # the gate's Linear(d, d) per block
    assert base["tflops_per_s"] == pytest.approx(base["flops_per_step"] / base["step_ms"] / 1e9)
    assert base["images_per_s"] == pytest.approx(2 / base["step_ms"] * 1e3)
    assert base["mfu"] is None and base["arch"]["attn"] == "softmax" and gate["arch"]["gate"] == "elementwise"
    assert [d["workers"] for d in res["data"]] == [0, 1] and all(d["images"] > 0 for d in res["data"])
    assert res["meta"]["data"]["jpegs"]["files"] == 8
    doc.write_text(f"# Performance\n{START}\n{END}\n")
    done = run_module("vitsinks.bench", "gpu", "table", f"out={out}", f"docs={doc}", "size=vit_cpu",
                      "variants=[base,gate]", "modes=[eager]")
    assert done.returncode == 0, done.stderr
    assert "| vit_cpu | gate | eager |" in doc.read_text() and "| 1 |" in doc.read_text()
