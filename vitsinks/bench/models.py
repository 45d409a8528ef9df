"""`python -m vitsinks.bench models`: train-step time of every variant against plain timm, interleaved."""

from __future__ import annotations

import torch
from timm.models.vision_transformer import VisionTransformer

from vitsinks.bench import interleaved, ratio_stats, table
from vitsinks.models import SIZES, build_vit

VARIANTS = {"base": {}, "gate": {"gate": "elementwise"}, "reg": {"registers": 4},
            "gate+reg": {"gate": "elementwise", "registers": 4}, "gate_headwise": {"gate": "headwise"},
            "sink_logit": {"attn": "sink_logit"}, "relu": {"attn": "relu"}, "sigmoid": {"attn": "sigmoid"}}


def gate_flop_share(dim: int, tokens: int) -> float:
    """Extra forward FLOPs of the elementwise gate relative to a block (qkv, scores, values, proj, MLP)."""
    block = 12 * dim * dim + 2 * tokens * dim
    return dim * dim / block


def _step_fn(model: torch.nn.Module, x: torch.Tensor) -> callable:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step


def run(size: str = "vit_cpu", batch: int = 32, repeats: int = 15, variants: list[str] | None = None) -> str:
    """Print and return the Markdown table of time ratios to timm."""
    torch.manual_seed(0)
    spec = SIZES[size]
    x = torch.randn(batch, 3, spec.img_size, spec.img_size)
    ref = VisionTransformer(img_size=spec.img_size, patch_size=spec.patch_size, embed_dim=spec.embed_dim,
                            depth=spec.depth, num_heads=spec.num_heads, num_classes=0, dynamic_img_size=True)
    fns = {"timm": _step_fn(ref, x)}
    for name in variants or list(VARIANTS):
        fns[name] = _step_fn(build_vit(size, **VARIANTS[name]), x)
    times = interleaved(fns, repeats=repeats)
    tokens = 1 + (spec.img_size // spec.patch_size) ** 2
    rows = []
    for name in fns:
        if name == "timm":
            continue
        med, lo, hi = ratio_stats(times[name], times["timm"])
        target = {"base": "<= 1.03", "gate": f"<= {1 + gate_flop_share(spec.embed_dim, tokens) + 0.05:.3f}"}
        rows.append([name, f"{med:.3f}", f"{lo:.3f}-{hi:.3f}", target.get(name, "")])
    out = (f"train step (forward + backward + AdamW), {size}, batch {batch}, {tokens} tokens, {repeats} interleaved "
           f"rounds; ratio to timm VisionTransformer (median, IQR)\n\n"
           + table(rows, ["variant", "time / timm", "IQR", "target"]))
    print(out)
    return out
