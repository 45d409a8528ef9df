"""`python -m vitsinks.bench models`: train-step time of every variant (each `exp` config, or those of `variants=`)
against plain timm and against `base`, interleaved in one run, and of `global+pen` against `base`; the kernel each
variant's forward runs and the activation memory of its step beside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from timm.models.vision_transformer import VisionTransformer

from vitsinks.benchmarks.timing import interleaved, ratio_stats, table
from vitsinks.configs.schema import exp_names, load_config
from vitsinks.models import SIZES, SinkBlock, model_from_config
from vitsinks.objectives.penalty import CommonModePenalty
from vitsinks.utils.errors import BadValue


def gate_flop_share(dim: int, tokens: int) -> float:
    """Extra forward FLOPs of the elementwise gate relative to a block (qkv, scores, values, proj, MLP)."""
    block = 12 * dim * dim + 2 * tokens * dim
    return dim * dim / block


def pathway_flop_share(dim: int, tokens: int, state_dim: int = 64) -> float:
    """Extra forward FLOPs of the global pathway relative to a block, per token."""
    block = 12 * dim * dim + 2 * tokens * dim
    return (dim * (state_dim + 3) + state_dim * dim / tokens) / block


def _step(model: torch.nn.Module, x: torch.Tensor, penalty: CommonModePenalty | None = None) -> Callable[[], None]:
    """One train step of `model` on `x` (plus the common-mode penalty when given)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        if penalty is not None:
            loss = loss + penalty()[0]
        loss.backward()
        opt.step()

    return step


def _exp_step(exp: str, size: str, x: torch.Tensor) -> tuple[Callable[[], None], torch.nn.Module]:
    """A train step of `exp`'s model (its common-mode penalty included when the variant has one), and the model."""
    cfg = load_config([f"exp={exp}", f"model={size}"])
    model = model_from_config(cfg.model)
    blocks = cast("list[SinkBlock]", model.blocks)
    penalty = CommonModePenalty(blocks, cfg.objective) if cfg.objective.cm_penalty else None
    return _step(model, x, penalty), model


def activation_mib(step: Callable[[], None], model: torch.nn.Module) -> float:
    """MiB of the tensors autograd keeps for the backward of one `step`, the parameters left out."""
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}  # storage -> bytes: views of one storage count once

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(saved.values()) / 2**20


def run(size: str = "vit_cpu", batch: int = 32, repeats: int = 15, variants: list[str] | None = None) -> str:
    """Return the Markdown table of each variant's time ratio to timm and to `base` (always measured beside them),
    its kernel and its activation memory (and of global+pen to base); `variants`: exp names (default: every one)."""
    torch.manual_seed(0)
    spec = SIZES[size]
    x = torch.randn(batch, 3, spec.img_size, spec.img_size)
    ref = VisionTransformer(img_size=spec.img_size, patch_size=spec.patch_size, embed_dim=spec.embed_dim,
                            depth=spec.depth, num_heads=spec.num_heads, num_classes=0, dynamic_img_size=True)
    fns = {"timm": _step(ref, x)}
    models: dict[str, torch.nn.Module] = {"timm": ref}
    names = list(variants or exp_names())
    unknown = sorted(set(names) - set(exp_names()))
    if unknown:
        raise BadValue(f"no exp config named {', '.join(unknown)}: choose among {', '.join(exp_names())}")
    for name in ["base", *(n for n in names if n != "base")]:
        fns[name], models[name] = _exp_step(name, size, x)
    memory = {name: activation_mib(fns[name], models[name]) for name in fns}
    times = interleaved(fns, repeats=repeats)
    tokens = 1 + (spec.img_size // spec.patch_size) ** 2
    # the targets set for these two (docs/performance-cpu.md); every other variant is measured without one
    target = {"base": "<= 1.03", "gate": f"<= {1 + gate_flop_share(spec.embed_dim, tokens) + 0.05:.3f}"}
    rows = []
    for name in fns:
        if name == "timm":
            continue
        med, lo, hi = ratio_stats(times[name], times["timm"])
        to_base = ratio_stats(times[name], times["base"])[0]
        kernel = cast("SinkBlock", cast(Any, models[name]).blocks[0]).attn.kernel()
        rows.append([name, kernel, f"{med:.3f}", f"{lo:.3f}-{hi:.3f}", target.get(name, ""), f"{to_base:.3f}",
                     f"{memory[name]:.1f}", f"{memory[name] / memory['timm']:.3f}"])
    out = (f"train step (forward + backward + AdamW), {size}, batch {batch}, {tokens} tokens, {repeats} interleaved "
           f"rounds; ratio to timm VisionTransformer (median, IQR); activations: MiB kept for the backward "
           f"(timm: {memory['timm']:.1f})\n\n"
           + table(rows, ["variant", "kernel", "time / timm", "IQR", "target", "time / base", "activations MiB",
                          "activations / timm"]))
    if "global+pen" in fns and "base" in fns:
        med, lo, hi = ratio_stats(times["global+pen"], times["base"])
        share = pathway_flop_share(spec.embed_dim, tokens)
        row = ["global+pen / base", f"{med:.3f}", f"{lo:.3f}-{hi:.3f}", f"<= {1 + share + 0.05:.3f}"]
        out += "\n\n" + table([row], ["ratio", "time", "IQR", "target (pathway FLOP share + 5%)"])
    return out
