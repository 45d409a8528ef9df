"""`python -m vitsinks.bench models`: train-step time of every variant (each `exp` config) against plain timm,
interleaved, and of `global+pen` against `base`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from timm.models.vision_transformer import VisionTransformer

from vitsinks.bench import interleaved, ratio_stats, table
from vitsinks.configs.schema import exp_names, load_config
from vitsinks.models import SIZES, model_from_config
from vitsinks.objectives.penalty import CommonModePenalty


def gate_flop_share(dim: int, tokens: int) -> float:
    """Extra forward FLOPs of the elementwise gate relative to a block (qkv, scores, values, proj, MLP)."""
    block = 12 * dim * dim + 2 * tokens * dim
    return dim * dim / block


def pathway_flop_share(dim: int, tokens: int, state_dim: int = 64) -> float:
    """Extra forward FLOPs of the global pathway relative to a block, per token: pooling score, value into the
    state, recipient gate, gated write-back (the state's output projection is once per image)."""
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


def _exp_step(exp: str, size: str, x: torch.Tensor) -> Callable[[], None]:
    """A train step of `exp`'s model, its common-mode penalty included when the variant has one."""
    cfg = load_config([f"exp={exp}", f"model={size}"])
    model = model_from_config(cfg.model)
    return _step(model, x, CommonModePenalty(model.blocks, cfg.objective) if cfg.objective.cm_penalty else None)


def run(size: str = "vit_cpu", batch: int = 32, repeats: int = 15, variants: list[str] | None = None) -> str:
    """Print and return the Markdown table of time ratios to timm (and of global+pen to base)."""
    torch.manual_seed(0)
    spec = SIZES[size]
    x = torch.randn(batch, 3, spec.img_size, spec.img_size)
    ref = VisionTransformer(img_size=spec.img_size, patch_size=spec.patch_size, embed_dim=spec.embed_dim,
                            depth=spec.depth, num_heads=spec.num_heads, num_classes=0, dynamic_img_size=True)
    fns = {"timm": _step(ref, x)}
    for name in variants or exp_names():
        fns[name] = _exp_step(name, size, x)
    times = interleaved(fns, repeats=repeats)
    tokens = 1 + (spec.img_size // spec.patch_size) ** 2
    target = {"base": "<= 1.03", "gate": f"<= {1 + gate_flop_share(spec.embed_dim, tokens) + 0.05:.3f}"}
    rows = []
    for name in fns:
        if name == "timm":
            continue
        med, lo, hi = ratio_stats(times[name], times["timm"])
        rows.append([name, f"{med:.3f}", f"{lo:.3f}-{hi:.3f}", target.get(name, "")])
    out = (f"train step (forward + backward + AdamW), {size}, batch {batch}, {tokens} tokens, {repeats} interleaved "
           f"rounds; ratio to timm VisionTransformer (median, IQR)\n\n"
           + table(rows, ["variant", "time / timm", "IQR", "target"]))
    if "global+pen" in fns and "base" in fns:
        med, lo, hi = ratio_stats(times["global+pen"], times["base"])
        share = pathway_flop_share(spec.embed_dim, tokens)
        row = ["global+pen / base", f"{med:.3f}", f"{lo:.3f}-{hi:.3f}", f"<= {1 + share + 0.05:.3f}"]
        out += "\n\n" + table([row], ["ratio", "time", "IQR", "target (pathway FLOP share + 5%)"])
    print(out)
    return out
