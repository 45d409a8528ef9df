"""One PNG per synthetic task, drawn from its JSON result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from vitsinks.utils.plotting import save_figure


def _matrix(ax: plt.Axes, m: Any, title: str) -> None:
    ax.imshow(np.asarray(m), cmap="viridis", vmin=0, vmax=1)
    ax.set_title(title, fontsize=8)
    ax.set_xlabel("key")
    ax.set_ylabel("query")


def trigger_figure(r: dict[str, Any], path: Path) -> Path:
    models = r["models"]
    names = list(models)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    x = np.arange(len(names))
    axes[0].bar(x, [models[n]["bos_attention_nontrigger"] for n in names],
                color=["tab:red" if "softmax" in n else "tab:blue" for n in names])
    axes[0].set_xticks(x, names, fontsize=8)
    axes[0].set_ylim(0, 1.05)
    axes[0].axhline(0.9, ls="--", color="gray", lw=1)
    axes[0].axhline(0.05, ls=":", color="gray", lw=1)
    axes[0].set_ylabel("mean attention on BOS, non-trigger queries")
    for i, n in enumerate(names):
        axes[0].text(i, 0.5, f"err {models[n]['task_rel_error']:.1e}", ha="center", rotation=90, fontsize=7)
    _matrix(axes[1], models["softmax_1h"]["attention_mean"], "softmax, 1 head: mean attention (BOS = column 0)")
    _matrix(axes[2], models["relu_1h"]["attention_mean"], "ReLU, 1 head: mean attention")
    return save_figure(fig, path, "trigger task: normalisation forces a BOS sink")


def nop_figure(r: dict[str, Any], path: Path) -> Path:
    m = r["models"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    _matrix(axes[0], m["damping"]["attention_example"],
            f"damping: NOP sink on BOS (ratio_out {m['damping']['ratio_out']:.2f})")
    _matrix(axes[1], m["control"]["attention_example"], "control: no damping, no sink")
    for name, color in (("damping", "tab:red"), ("control", "tab:gray")):
        sv = np.asarray(m[name]["qk_singular_values"])
        label = f"{name}: s1/sum {m[name]['qk_sigma1_frac']:.2f}, s1/s2 {m[name]['qk_sigma1_over_sigma2']:.1f}"
        axes[2].plot(np.arange(1, len(sv) + 1), sv / sv.sum(), "o-", color=color, label=label)
    axes[2].set_xlabel("singular value index")
    axes[2].set_ylabel("share of the spectrum of W_Q W_K^T")
    axes[2].legend(fontsize=7)
    return save_figure(fig, path, "nop task: conditional damping makes a NOP sink and a spike in the QK spectrum")


def broadcast_figure(r: dict[str, Any], path: Path) -> Path:
    maps = [np.asarray(a) for a in r["attention_example"]]  # per block (H, N, N)
    cols = sum(m.shape[0] for m in maps)
    fig, axes = plt.subplots(1, cols, figsize=(3.3 * cols, 3.6))
    i = 0
    for b, m in enumerate(maps):
        for h in range(m.shape[0]):
            hub = (b, h) == (r["hub_block"], r["hub_head"])
            _matrix(axes[i], m[h], f"block {b} head {h}" + (" (hub)" if hub else ""))
            axes[i].axvline(r["source_example"], color="tab:red", lw=0.8, ls=":")
            i += 1
    return save_figure(fig, path, f"broadcast task: hub on the source (red), ratio_out {r['hub_ratio_out']:.2f}, "
                                  f"stable rank {r['hub_stable_rank']:.2f}")


def broadcast_pathway_figure(r: dict[str, Any], path: Path) -> Path:
    """Per arm: task MSE, inflow per layer, removal costs; dots per seed, the reference's means as crosses."""
    arms = list(r["arms"])
    ref, rr = r["reference"], r["reference_recipe"]
    seeds = r["per_seed"]
    x = np.arange(len(arms))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].bar(x, [r["arms"][a]["mse"] for a in arms], color="tab:blue", alpha=0.7)
    for i, a in enumerate(arms):
        axes[0].plot([i] * len(seeds[a]), [s["mse"] for s in seeds[a]], "o", color="black", ms=3)
        axes[0].plot(i, ref[a]["mse"], "x", color="tab:red", ms=8, label=f"reference ({rr['n_seeds']} seeds, "
                     f"{rr['steps']} x {rr['batch']}, lr {rr['lr']})" if i == 0 else None)
    for layer, color, off in ((0, "tab:gray", -0.2), (1, "tab:orange", 0.2)):
        axes[1].bar(x + off, [r["arms"][a]["inflow"][layer] for a in arms], 0.38, color=color, alpha=0.75,
                    label=f"layer {layer + 1}")
        for i, a in enumerate(arms):
            axes[1].plot([i + off] * len(seeds[a]), [s["inflow"][layer] for s in seeds[a]], "o", color="black", ms=3)
            axes[1].plot(i + off, ref[a]["inflow"][layer], "x", color="tab:red", ms=8)
    axes[1].axhline(0.8, color="gray", ls=":", lw=1)
    axes[1].axhline(0.15, color="gray", ls=":", lw=1)
    axes[1].set_ylim(0, 1.05)
    for key, color, off, name in (("d_mse_no_pathway_layer2", "tab:green", -0.2, "remove layer-2 pathway"),
                                  ("d_mse_no_attention_layer2", "tab:purple", 0.2, "remove layer-2 attention")):
        have = [i for i, a in enumerate(arms) if key in r["arms"][a]]  # the attention arm has no pathway
        axes[2].bar(x[have] + off, [r["arms"][arms[i]][key] for i in have], 0.38, color=color, alpha=0.75,
                    label=name)
        for i in have:
            axes[2].plot([i + off] * len(seeds[arms[i]]), [s[key] for s in seeds[arms[i]]], "o", color="black", ms=3)
            if key in ref[arms[i]]:
                axes[2].plot(i + off, ref[arms[i]][key], "x", color="tab:red", ms=8)
    axes[2].set_yscale("symlog", linthresh=1e-3)  # an unused pathway can cost slightly < 0
    for ax, label in zip(axes, ("task MSE (test)", "sink inflow: max_s mean_i A_is",
                                "MSE increase when removed from layer 2"), strict=True):
        ax.set_xticks(x, arms)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    return save_figure(fig, path, f"controlled broadcast task: {r['n_seeds']} seeds x {r['steps']} steps, batch "
                                  f"{r['batch']}, lr {r['lr']}, lambda_B {r['cm_penalty']} on pen_1 + pen_2 "
                                  "(red x: reference means)")


FIGURES = {"trigger": trigger_figure, "nop": nop_figure, "broadcast": broadcast_figure,
           "broadcast_pathway": broadcast_pathway_figure}
