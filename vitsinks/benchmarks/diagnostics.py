"""`python -m vitsinks.bench diagnostics`: diagnostics cost per image relative to a forward pass, and memory."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from vitsinks.backbones import adapt
from vitsinks.benchmarks.timing import interleaved, ratio_stats, table
from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics import diagnose
from vitsinks.diagnostics.neurons import NeuronCollector, neuron_k, summarize_neurons
from vitsinks.models import SIZES, build_vit


def _setup(size: str, batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    spec = SIZES[size]
    return build_vit(size).eval(), torch.randn(batch, 3, spec.img_size, spec.img_size)


_MEASURE = """
import gc, json, sys, torch
from vitsinks.benchmarks.diagnostics import _setup, adapt, diagnose
mode, size, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
model, x = _setup(size, batch)
torch.set_grad_enabled(False)
model(x[:1])  # allocator and kernels warm, outside the measurement
gc.collect()
open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS (VmHWM) to the current RSS
status = lambda key: int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])
base = status("VmRSS:")
model(x) if mode == "forward" else diagnose(adapt(model), x, batch_size=batch, keep_maps=0)
print(json.dumps((status("VmHWM:") - base) / 1024))
"""


def peak_rss_mb(mode: str, size: str, batch: int) -> float:
    """Peak resident memory (MB) above the loaded model of a fresh process that runs `mode` once (Linux)."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, mode, size, str(batch)], capture_output=True, text=True,
                         check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def run(size: str = "vit_small", batch: int = 8, repeats: int = 5) -> str:
    """Return the time and memory ratios."""
    model, x = _setup(size, batch)
    backbone = adapt(model)
    settings = DiagnosticsConfig()

    def with_neurons() -> None:  # what run_diagnostics does: the neurons collected during the diagnosis
        collector = NeuronCollector(backbone.blocks, neuron_k(settings.high_norm_k), backbone.num_prefix)
        diagnose(backbone, x, batch_size=batch, keep_maps=0, neurons=collector)
        summarize_neurons(backbone, None, settings, collector.got)

    with torch.no_grad():
        times = interleaved({"forward": lambda: model(x),
                             "diagnose": lambda: diagnose(backbone, x, batch_size=batch, keep_maps=0),
                             "all": with_neurons},
                            repeats=repeats, warmup=1)
    med, lo, hi = ratio_stats(times["diagnose"], times["forward"])
    med_all, lo_all, hi_all = ratio_stats(times["all"], times["forward"])
    fwd, diag = peak_rss_mb("forward", size, batch), peak_rss_mb("diagnose", size, batch)
    mem = diag / max(fwd, 1e-6)
    rows = [["time per image, diagnostics / forward", f"{med:.2f}", f"{lo:.2f}-{hi:.2f}", "<= 3"],
            ["... with the register neurons (the whole residual suite) / forward", f"{med_all:.2f}",
             f"{lo_all:.2f}-{hi_all:.2f}", "<= 3"],
            ["peak memory above the model, diagnostics / forward", f"{mem:.2f}", "", ""]]
    return (f"diagnostics (all per-image fields, the residual side, spectra, recomputation check) on {size}, "
            f"batch {batch}, {repeats} interleaved rounds; peak memory above the loaded model: forward {fwd:.0f} MB, "
            f"diagnostics {diag:.0f} MB"
            f"\n\n" + table(rows, ["measure", "ratio", "IQR", "target"]))
