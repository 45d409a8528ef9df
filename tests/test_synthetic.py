"""The synthetic tasks train, seeded, and the diagnostics classify each case as the task guarantees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from vitsinks.synthetic import run_broadcast, run_nop, run_trigger
from vitsinks.synthetic.figures import FIGURES
from vitsinks.synthetic.model import SeqModel
from vitsinks.synthetic.pathway_task import ablated, evaluate_arm, pathway_batch, task_constants, train_arm


def test_trigger_softmax_sinks_on_bos_relu_does_not() -> None:
    r = run_trigger(steps=700, seed=0)["models"]
    for heads in (1, 4):
        soft, relu = r[f"softmax_{heads}h"], r[f"relu_{heads}h"]
        assert soft["bos_attention_nontrigger_max_head"] >= 0.9
        assert relu["bos_attention_nontrigger"] <= 0.05
        # comparable task error: both solve it (relative error well under 5%)
        assert soft["task_rel_error"] < 0.05 and relu["task_rel_error"] < 0.05


def test_nop_task_makes_a_nop_sink_on_bos_with_a_qk_spike_and_control_does_not() -> None:
    m = run_nop(steps=800, seed=0)["models"]
    damp, ctrl = m["damping"], m["control"]
    assert damp["sink_on_bos_rate"] >= 0.8 and damp["nop_rate"] == damp["sink_event_rate"]
    assert damp["ratio_out"] <= 0.2
    assert ctrl["sink_event_rate"] == 0.0
    assert damp["qk_sigma1_frac"] > 1.5 * ctrl["qk_sigma1_frac"]
    assert damp["qk_sigma1_over_sigma2"] > 2 * ctrl["qk_sigma1_over_sigma2"]


def test_broadcast_task_hub_is_classified_broadcast() -> None:
    r = run_broadcast(steps=800, seed=0)
    assert r["hub_event_rate"] >= 0.9 and r["hub_on_source_rate"] >= 0.9
    assert r["hub_broadcast_rate"] >= 0.9
    assert r["hub_ratio_out"] >= 0.5 and r["hub_stable_rank"] <= 1.5


def test_cli_writes_json_and_figure(tmp_path: Path, figures: list) -> None:
    out = subprocess.run([sys.executable, "-m", "vitsinks.synthetic", "task=broadcast", "steps=300",
                          f"out={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "broadcast.json").read_text())["task"] == "broadcast"
    assert (tmp_path / "broadcast.png").stat().st_size > 10_000
    r = json.loads((tmp_path / "broadcast.json").read_text())
    FIGURES["broadcast"](r, tmp_path / "again.png")  # the panels are the result's attention maps, hub marked
    drawn = [ax.images[0].get_array() for ax in figures[-1].axes if ax.images]
    expected = [np.asarray(m)[h] for m in r["attention_example"] for h in range(np.asarray(m).shape[0])]
    assert len(drawn) == len(expected) and all(np.array_equal(d, e) for d, e in zip(drawn, expected, strict=True))
    assert sum("(hub)" in ax.get_title() for ax in figures[-1].axes) == 1
    bad = subprocess.run([sys.executable, "-m", "vitsinks.synthetic", "task=nope"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown task" in bad.stderr


def test_broadcast_pathway_task_reproduces_the_reference_pattern() -> None:
    """SPEC section 7 (seed 0, 800 steps of batch 128): attention alone routes layer 2 to the source (inflow >= 0.8);
    with the global pathway and the penalty neither layer sinks (<= 0.15) at a task MSE within 10% of attention
    alone, and the trained model then needs its pathway far more than layer 2's attention."""
    x, y, _ = pathway_batch(torch.Generator().manual_seed(10_007), batch=512)
    attention = evaluate_arm(train_arm("attention", 0, 800, 128)[0], x, y)
    penalised = evaluate_arm(train_arm("global+pen", 0, 800, 128)[0], x, y)
    assert attention["inflow"][1] >= 0.8
    assert max(penalised["inflow"]) <= 0.15
    assert penalised["mse"] <= 1.1 * attention["mse"]
    assert penalised["d_mse_no_pathway"] > 10 * penalised["d_mse_no_attention_layer2"]


def test_arms_see_the_same_batches_and_ablation_removes_what_it_names() -> None:
    a, b = pathway_batch(torch.Generator().manual_seed(3)), pathway_batch(torch.Generator().manual_seed(3))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    x, y, _ = a
    u, R = task_constants()
    src = (x @ u).argmax(-1)
    assert torch.allclose(y - x, (x[torch.arange(len(x)), src] @ R)[:, None].expand_as(x), atol=1e-5)
    torch.manual_seed(0)
    model = SeqModel(64, None, dim=64, depth=2, heads=1, pathway={"state_dim": 8})
    h = model.embed(x[:4])
    with torch.no_grad():
        with ablated(model, pathway=True, attention_block=1):
            out = model(x[:4])
        mid = model.blocks[0](h) - model.blocks[0].pathway(model.blocks[0].norm1(h))
        assert torch.allclose(out, mid, atol=1e-5)  # block 1 adds nothing, block 0 only its attention


def test_pathway_options_belong_to_that_task_only(tmp_path: Path) -> None:
    bad = subprocess.run([sys.executable, "-m", "vitsinks.synthetic", "task=nop", "n_seeds=2", f"out={tmp_path}"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "broadcast_pathway only" in bad.stderr
