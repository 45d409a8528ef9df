"""The reference's optimiser under `recipe=paper` (src/trainer.py): AdamW with the run's weight decay on every model
parameter and 1e-7 on the online probe, and a warmup whose first step has lr 0 (`step / warmup`)."""

from __future__ import annotations

import torch
from torch import nn

from tests.helpers.tiny import tiny_cfg, tiny_vit
from vitsinks.configs.schema import load_config
from vitsinks.objectives.lejepa import LeJEPA
from vitsinks.objectives.objective import Runtime
from vitsinks.train.optim import WarmupCosine, build_optimizer

PAPER_OPTIM = ["train.lr=5e-4", "train.weight_decay=0.05", "objective.probe_lr=1e-3", "train.decay_all_params=true",
               "objective.probe_weight_decay=1e-7", "train.warmup_from_zero=true", "train.min_lr_ratio=1e-3"]


def reference_lr_lambda(step: int, warmup: int, total: int) -> float:
    """The reference's schedule multiplier as it computes it: linear warmup step / warmup, then cosine to 1 / 1000
    (its cosine in float32 of progress x 3.1415926535: float32 rounding apart from the exact one)."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    return 0.001 + 0.5 * (1.0 - 0.001) * (1.0 + torch.cos(torch.tensor(progress * 3.1415926535)).item())


def reference_decay(model: nn.Module) -> dict[int, tuple[float, float]]:
    """id(parameter) -> (lr, weight decay) of the reference's two groups: every parameter of the encoder (backbone
    and projector) at (lr, wd), every parameter of the probe at (probe_lr, 1e-7)."""
    out = {id(p): (5e-4, 0.05) for name, p in model.named_parameters() if not name.startswith("probe.")}
    return out | {id(p): (1e-3, 1e-7) for p in model.probe.parameters()}


def _settings(optimizer: torch.optim.Optimizer) -> dict[int, tuple[float, float]]:
    return {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}


def _lejepa_model(cfg) -> nn.Module:
    return LeJEPA(cfg, Runtime(torch.device("cpu"))).build_model(tiny_vit(registers=2, layerscale_init=1e-4), 4)


def test_the_paper_recipe_sets_the_references_optimiser() -> None:
    t, o = load_config(["recipe=paper"]).train, load_config(["recipe=paper"]).objective
    assert t.decay_all_params and t.warmup_from_zero and o.probe_weight_decay == 1e-7
    assert (t.lr, t.weight_decay, o.probe_lr, t.min_lr_ratio) == (5e-4, 0.05, 1e-3, 1e-3)  # PAPER_OPTIM's
    d = load_config([])
    assert not d.train.decay_all_params and not d.train.warmup_from_zero and d.objective.probe_weight_decay == 0


def test_every_parameter_decays_as_in_the_references_param_groups(runs) -> None:
    cfg = tiny_cfg(runs, *PAPER_OPTIM)
    model = _lejepa_model(cfg)
    optimizer, _ = build_optimizer(model, cfg, 10, 100, LeJEPA.probe_prefixes)
    got = {id(p): (g["initial_lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    assert got == reference_decay(model)
    # the default decays none of these: biases, norms, tokens, position embedding, LayerScale, the projector's
    # BatchNorm; nor the probe
    default_off = ["backbone.cls_token", "backbone.reg_token", "backbone.pos_embed", "backbone.patch_embed.proj.bias",
                   "backbone.blocks.0.norm1.weight", "backbone.blocks.0.attn.qkv.bias", "backbone.blocks.0.ls1.gamma",
                   "backbone.norm.bias", "projector.layers.1.weight", "projector.layers.1.bias", "probe.1.weight"]
    params = dict(model.named_parameters())
    assert all(got[id(params[n])][1] > 0 for n in default_off)
    plain, _ = build_optimizer(model, tiny_cfg(runs), 10, 100, LeJEPA.probe_prefixes)
    assert all(_settings(plain)[id(params[n])][1] == 0 for n in default_off)
    assert len(plain.param_groups) == len(optimizer.param_groups)  # a run can resume under the other setting


def test_the_warmup_starts_at_zero_as_the_references_schedule(runs) -> None:
    warmup, total = 5, 20
    ours = WarmupCosine(warmup, total, 1e-3, from_zero=True)
    for step in range(total + 1):
        assert abs(ours(step) - reference_lr_lambda(step, warmup, total)) < 1e-7  # float32 cosine
    assert [ours(s) for s in range(warmup)] == [reference_lr_lambda(s, warmup, total) for s in range(warmup)]
    # and through the optimizer: the lr the first steps take
    cfg = tiny_cfg(runs, *PAPER_OPTIM, "train.warmup_epochs=1")
    model = nn.Linear(3, 3)
    optimizer, scheduler = build_optimizer(model, cfg, steps_per_epoch=warmup, total_steps=total)
    seen = []
    for _ in range(total):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen[0] == 0.0
    assert all(abs(a - 5e-4 * reference_lr_lambda(s, warmup, total)) < 5e-4 * 1e-7 for s, a in enumerate(seen))
    default = WarmupCosine(warmup, total, 1e-3)
    assert [default(s) for s in range(warmup)] == [(s + 1) / warmup for s in range(warmup)]  # vitsinks' own
