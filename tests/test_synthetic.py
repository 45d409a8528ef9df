"""The synthetic tasks train, seeded, and the diagnostics classify each case as the task guarantees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vitsinks.synthetic import run_broadcast, run_nop, run_trigger


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


def test_cli_writes_json_and_figure(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "vitsinks.synthetic", "task=broadcast", "steps=300",
                          f"out={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "broadcast.json").read_text())["task"] == "broadcast"
    assert (tmp_path / "broadcast.png").stat().st_size > 10_000
    bad = subprocess.run([sys.executable, "-m", "vitsinks.synthetic", "task=nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown task" in bad.stderr
