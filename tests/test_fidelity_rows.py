"""Rows of docs/fidelity.md's table that had no test behind them, each held against an independent statement of the
reference's protocol written here (KempnerInstitute/attention_sink, commit a83cd59; never imported from vitsinks):

- precision of the analyses: `vit_causal/common.py` runs "inference-only and fp32", `lejepa_sinks/diagnose.py` the
  same, without autocast;
- the gate x register sweep's init (`src/vit.py` `_init_weights`, `src/blocks.py` `LayerScale`);
- the projector (`src/vit.py` `ViTEncoder.proj`: Linear(+bias)-BN-ReLU twice, then Linear) and its per-GPU BatchNorm;
- the causal preset's numbers (`vit_causal/select_heads.py`, `analyze.py`, `interventions.py`, `common.py` defaults)
  and where head selection parts from `select_heads.py` (a tie exactly at the top-k cut);
- the training recipe's numbers (`src/config.py` defaults, `runs/run_mitigation.sh`, `src/trainer.py`,
  `src/sigreg.py`) and its view augmentations (`src/data.py` `MultiViewTransform`), bit for bit under the recipe,
  and where the default's DINO views differ.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from unittest import mock

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image
from torch import nn
from torchvision import transforms

from vitsinks.backbones import adapt
from vitsinks.benchmarks.data import natural_image
from vitsinks.configs.schema import InterveneConfig, load_config
from vitsinks.data.crops import SeededViews, sample_seed, seeded_rngs, view_transform
from vitsinks.data.device_crops import view_specs
from vitsinks.diagnostics import SinkRules, diagnose
from vitsinks.diagnostics import rules as sink_rules
from vitsinks.interventions import intervene, stage_one
from vitsinks.interventions.engine import select_heads
from vitsinks.models import SIZES, build_vit, model_from_config
from vitsinks.objectives.lejepa import LeJEPA, LeJEPALoss
from vitsinks.objectives.objective import Runtime


# --- precision of analyses ---------------------------------------------------------------------------------------
def _precision_probe(model: nn.Module) -> tuple[list[str], list[str], list]:
    """Forward hooks on every submodule recording what is not the reference's fp32 without autocast: an autocast
    enabled (CPU or CUDA), a floating tensor in or out that is not float32, a float32 matmul precision other than
    PyTorch's default ("highest": no TF32 / bf16 matmuls). Returns (the problems, the modules called, the hooks)."""
    problems: list[str] = []
    calls: list[str] = []

    def check(name: str):
        def hook(module: nn.Module, args: tuple, out) -> None:
            if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
                problems.append(f"{name}: autocast on")
            if torch.get_float32_matmul_precision() != "highest":
                problems.append(f"{name}: matmul precision {torch.get_float32_matmul_precision()}")
            outs = out if isinstance(out, tuple | list) else (out,)
            for t in (*args, *outs):
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float32:
                    problems.append(f"{name}: {t.dtype}")
            calls.append(name)
        return hook

    handles = [m.register_forward_hook(check(n)) for n, m in model.named_modules() if n]
    return problems, calls, handles


def _analysed_vit() -> nn.Module:
    torch.manual_seed(0)
    return build_vit("vit_cpu", img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=2, gate="elementwise",
                     registers=2, layerscale_init=0.5).eval()


def test_the_analyses_run_in_fp32_without_autocast() -> None:
    """The diagnostics (`vitsinks.diagnostics.diagnose`, what `vitsinks.diagnose` and the training callback call) and
    the intervention engine run every module in float32 with no autocast, as the reference's analyses do."""
    model = _analysed_vit()
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    problems, calls, handles = _precision_probe(model)
    try:
        d = diagnose(model, x[:4], batch_size=2)
        diagnosed = set(calls)
        subject = adapt(model.eval())
        fields = stage_one(subject, x[:4], 4)
        fields["routed_frac"][:] = 1.0  # every head an event, so that the named head can be edited
        st = InterveneConfig(n_images=4, heldout_images=4, heads=["1:0"], batch_size=4)
        res = intervene(subject, x[:4], None, x[4:], st, stage1=fields, progress=False)
    finally:
        for h in handles:
            h.remove()
    assert not problems, problems[:5]
    # the hooks saw the analyses' own forward passes: every block's attention projections, gate and MLP; the
    # intervention's rest of the network up to the final norm
    for name in ("patch_embed.proj", "blocks.0.attn.qkv", "blocks.0.attn.gate", "blocks.1.attn.proj",
                 "blocks.1.mlp.fc2"):
        assert name in diagnosed, name
    assert "norm" in calls and res.rows and d["mass"].dtype == np.float32


# --- gate x register sweep init ----------------------------------------------------------------------------------
# recipe=paper (the sweep's gated model with registers) at a size with enough entries per tensor for the stds
TINY_SWEEP = ["exp=gate+reg", "recipe=paper", "model.embed_dim=192", "model.depth=2", "model.num_heads=3",
              "model.img_size=32", "model.patch_size=8"]


def _std_close(t: torch.Tensor, std: float) -> bool:
    """The sample std of t's entries within 6 standard errors of `std` (for n normal draws the sample std's relative
    error is ~1 / sqrt(2 n)), and the bound never tighter than 5 %: a wrong init (timm's 1e-6 tokens, PyTorch's
    kaiming-uniform Linears) is off by far more, the right one cannot fail by chance."""
    n = t.numel()
    tol = max(0.05, 6 / math.sqrt(2 * n))
    return abs(float(t.detach().std()) / std - 1) < tol


def test_the_paper_recipe_initialises_as_the_references_sweep() -> None:
    """src/vit.py `_init_weights`: pos_embed, [CLS] and registers trunc-normal 0.02; every Linear trunc-normal 0.02
    with zero bias except the gate (`gate_proj`: normal 1e-6, bias 2); LayerNorms 1 / 0; src/blocks.py LayerScale
    `ls_init * ones` (1e-4) on both branches; the patch embedding is an nn.Conv2d left at PyTorch's init
    (kaiming-uniform: entries in +-1 / sqrt(fan_in), std bound / sqrt(3))."""
    torch.manual_seed(0)
    model = model_from_config(load_config(TINY_SWEEP).model)
    assert model.num_reg_tokens == 4 and all(b.attn.gate is not None for b in model.blocks)
    for t in (model.pos_embed, model.cls_token, model.reg_token):
        assert _std_close(t, 0.02) and float(t.detach().abs().max()) < 2  # torch's trunc bounds +-2
    tokens = torch.cat([model.cls_token.flatten(), model.reg_token.flatten()])
    assert _std_close(tokens, 0.02)  # timm's default would be 1e-6
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert len(linears) == 2 * 5  # qkv, gate, proj, fc1, fc2 per block
    for name, lin in linears.items():
        if name.endswith("attn.gate"):
            assert _std_close(lin.weight, 1e-6), name
            assert torch.equal(lin.bias, torch.full_like(lin.bias, 2.0)), name
        else:
            assert _std_close(lin.weight, 0.02), name
            assert lin.bias is None or not lin.bias.any(), name
    assert all(lin.bias is None for n, lin in linears.items() if n.endswith("attn.qkv"))  # qkv_bias False
    for blk in model.blocks:
        for ls in (blk.ls1.gamma, blk.ls2.gamma):
            assert torch.equal(ls, 1e-4 * torch.ones(192))  # the reference's float32 1e-4, exactly
    for norm in [m for m in model.modules() if isinstance(m, nn.LayerNorm)]:
        assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and not norm.bias.any()
    conv = model.patch_embed.proj
    bound = 1 / math.sqrt(conv.weight[0].numel())
    assert float(conv.weight.detach().abs().max()) <= bound and _std_close(conv.weight, bound / math.sqrt(3))


# --- projector ---------------------------------------------------------------------------------------------------
def reference_projector(dim: int, hidden: int, out: int) -> nn.Sequential:
    """src/vit.py `ViTEncoder.proj`: Linear(dim, 2048)-BN-ReLU-Linear(2048, 2048)-BN-ReLU-Linear(2048, proj_dim),
    every Linear with its bias."""
    return nn.Sequential(nn.Linear(dim, hidden, bias=True), nn.BatchNorm1d(hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden, bias=True), nn.BatchNorm1d(hidden), nn.ReLU(),
                         nn.Linear(hidden, out, bias=True))


def _lejepa_model(*overrides: str) -> nn.Module:
    cfg = load_config(["objective.proj_hidden=64", "objective.proj_out=32", "objective.proj_layers=3", *overrides])
    backbone = build_vit("vit_cpu", img_size=32, patch_size=8, embed_dim=48, depth=1, num_heads=3)
    return LeJEPA(cfg, Runtime(torch.device("cpu"))).build_model(backbone, 4)


def test_lightlys_projector_computes_the_references_stack_in_training() -> None:
    """lightly's LeJEPAProjectionHead has no bias before a BatchNorm: in train mode (where the projector is used: the
    reference's validation reads the backbone's [CLS] only) the BatchNorm subtracts the batch mean, so a bias there
    changes nothing. Same weights, random biases on the reference's side: outputs and gradients equal."""
    torch.manual_seed(0)
    ours = _lejepa_model("recipe=paper").projector.train()
    ref = reference_projector(48, 64, 32).train()
    linears = [m for m in ours.modules() if isinstance(m, nn.Linear)]
    norms = [m for m in ours.modules() if isinstance(m, nn.BatchNorm1d)]
    assert [lin.bias is None for lin in linears] == [True, True, False] and len(norms) == 2
    with torch.no_grad():
        for mine, theirs in zip(linears, [m for m in ref if isinstance(m, nn.Linear)], strict=True):
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias if mine.bias is not None else torch.randn_like(theirs.bias))
        for mine, theirs in zip(norms, [m for m in ref if isinstance(m, nn.BatchNorm1d)], strict=True):
            mine.weight.copy_(0.5 + torch.rand_like(mine.weight))  # away from the init, so the affine part matters
            mine.bias.copy_(torch.randn_like(mine.bias))
            theirs.load_state_dict(mine.state_dict())
    emb = torch.randn(4 * 16, 48, requires_grad=True)  # 4 views x 16 images, as one rank's batch
    got, want = ours(emb), ref(emb)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    g = torch.randn_like(got)
    (grad_ours,) = torch.autograd.grad(got, emb, g)
    (grad_ref,) = torch.autograd.grad(want, emb, g)
    torch.testing.assert_close(grad_ours, grad_ref, rtol=0, atol=1e-5)


def test_the_projector_batchnorm_is_per_rank_under_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DDP the reference's nn.BatchNorm1d normalises each GPU's batch (no SyncBatchNorm); `recipe=paper`
    (`objective.projector_bn=per_rank`) keeps plain BatchNorms, the default makes them global-batch ones."""
    from vitsinks.utils import distributed
    from vitsinks.utils.distributed import AllReduceBatchNorm1d

    monkeypatch.setattr(distributed, "is_distributed", lambda: True)  # build as a rank of a DDP run would
    paper = [type(m) for m in _lejepa_model("recipe=paper").modules() if isinstance(m, nn.BatchNorm1d)]
    default = [type(m) for m in _lejepa_model().modules() if isinstance(m, nn.BatchNorm1d)]
    assert paper == [nn.BatchNorm1d, nn.BatchNorm1d]
    assert default == [AllReduceBatchNorm1d, AllReduceBatchNorm1d]


# --- the causal preset's numbers ---------------------------------------------------------------------------------
# vit_causal/select_heads.py argparse defaults; analyze.py --min_events; interventions.py --n_images, --batch_size,
# --seed, --mean_heldout_n; common.py's thresholds (ROUTE_THR, DEF1_FRAC, NOP_RATIO_MAX, BC_RATIO_MIN, BC_SR_MAX)
REFERENCE_CAUSAL = {"min_events": 50, "k_deep": 16, "k_blk0": 4, "analyze_min_events": 20, "n_images": 4096,
                    "batch_size": 32, "seed": 0, "mean_heldout_n": 4096}
REFERENCE_THRESHOLDS = {"route_thr": 0.5, "def1_frac": 0.9, "nop_ratio_max": 0.2, "bc_ratio_min": 0.5,
                        "bc_sr_max": 1.5}


def reference_event_class(routed_frac: np.ndarray, ratio_out: np.ndarray, stable_rank: np.ndarray) -> np.ndarray:
    """common.py `event_class`: 'none' unless routed_frac >= 0.9; 'nop' ratio_out <= 0.2; 'broadcast' ratio_out >=
    0.5 and stable rank <= 1.5; 'other' otherwise."""
    t = REFERENCE_THRESHOLDS
    cls = np.full(ratio_out.shape, "other", dtype=object)
    cls[ratio_out <= t["nop_ratio_max"]] = "nop"
    cls[(ratio_out >= t["bc_ratio_min"]) & (stable_rank <= t["bc_sr_max"])] = "broadcast"
    cls[~(routed_frac >= t["def1_frac"])] = "none"
    return cls


def test_the_causal_preset_has_the_references_selection_values_and_thresholds() -> None:
    cfg = load_config(["selection=kempner_causal"])
    iv, dg = cfg.intervene, cfg.diagnostics
    r = REFERENCE_CAUSAL
    assert (iv.min_events, iv.top_k, iv.top_k_block0, iv.min_class_events) == \
        (r["min_events"], r["k_deep"], r["k_blk0"], r["analyze_min_events"])
    assert (iv.n_images, iv.batch_size, iv.seed, iv.heldout_images) == \
        (r["n_images"], r["batch_size"], r["seed"], r["mean_heldout_n"])
    assert (dg.rule, dg.ratio, dg.use_stable_rank) == ("relaxed", "ratio_out", True)
    t = REFERENCE_THRESHOLDS
    assert (sink_rules.ROUTED_MIN, sink_rules.NOP_MAX, sink_rules.BROADCAST_MIN, sink_rules.BROADCAST_MAX_RANK) == \
        (t["def1_frac"], t["nop_ratio_max"], t["bc_ratio_min"], t["bc_sr_max"])
    # the classes themselves, on a grid that sits on and around every threshold
    grid = np.array(np.meshgrid([0.0, 0.89, 0.9, 0.95, 1.0], [0.0, 0.19, 0.2, 0.21, 0.49, 0.5, 0.51, 3.0],
                                [1.0, 1.49, 1.5, 1.51, 4.0], indexing="ij")).reshape(3, -1)
    fields = {"routed_frac": grid[0], "ratio_out": grid[1], "stable_rank": grid[2], "min_a": np.zeros(grid.shape[1])}
    got = SinkRules.from_config(dg).event_class(fields)
    assert got.tolist() == reference_event_class(grid[0], grid[1], grid[2]).tolist()


def reference_select(counts: np.ndarray, min_events: int, k_deep: int) -> list[tuple[int, int]]:
    """select_heads.py for one class in blocks >= 1: heads with >= min_events, `sorted(..., reverse=True)[:k]` of
    (count, layer, head): among equal counts the larger (layer, head) comes first."""
    items = sorted(((int(counts[b, h]), b, h) for b in range(1, counts.shape[0]) for h in range(counts.shape[1])
                    if counts[b, h] >= min_events), reverse=True)[:k_deep]
    return [(b, h) for _, b, h in items]


def test_a_tie_at_the_top_k_cut_is_where_head_selection_parts_from_the_reference() -> None:
    """docs/fidelity.md's row "ties at the top-k cut": the reference keeps the larger (count, block, head) of a tie,
    vitsinks the smaller; away from a tie at the cut both select the same heads."""
    def fields(counts: dict[tuple[int, int], int]) -> dict[str, np.ndarray]:
        n, shape = 8, (8, 3, 2)
        d = {"routed_frac": np.zeros(shape), "ratio_out": np.full(shape, 0.1), "stable_rank": np.ones(shape),
             "min_a": np.zeros(shape)}
        for (b, h), k in counts.items():
            d["routed_frac"][: min(k, n), b, h] = 1.0  # k NOP events
        return d

    tie = {(1, 0): 5, (2, 1): 5, (2, 0): 3}
    nop_counts = np.zeros((3, 2), int)
    for (b, h), k in tie.items():
        nop_counts[b, h] = k
    assert reference_select(nop_counts, 1, 1) == [(2, 1)]
    assert select_heads(fields(tie), SinkRules(), 1, 1, 0) == [(1, 0)]
    assert select_heads(fields(tie), SinkRules(), 1, 2, 0) == reference_select(nop_counts, 1, 2)[::-1]  # both
    untied = {(1, 0): 6, (2, 1): 5, (2, 0): 3}
    for (b, h), k in untied.items():
        nop_counts[b, h] = k
    for k in (1, 2, 3):
        assert select_heads(fields(untied), SinkRules(), 1, k, 0) == reference_select(nop_counts, 1, k)


# --- the training recipe's numbers -------------------------------------------------------------------------------
# src/config.py defaults with runs/run_mitigation.sh's COMMON flags (4 GPUs x --batch_size 64); src/trainer.py's
# schedule (warmup, cosine to lr / 1000), clip_grad_norm_(max_norm=1.0), the probe group's weight decay 1e-7, bf16
# autocast (--amp); src/sigreg.py SIGReg(knots=17, t_max=3.0, num_slices=256); src/vit.py's projector widths
REFERENCE_RECIPE = {"embed_dim": 1024, "depth": 24, "num_heads": 16, "patch_size": 16, "img_size": 224,
                    "qkv_bias": False, "mlp_ratio": 4.0, "drop_path": 0.1, "ls_init": 1e-4, "num_views": 4,
                    "crop_scale": (0.08, 1.0), "proj_hidden": 2048, "proj_dim": 128, "proj_linears": 3,
                    "lamb": 0.02, "knots": 17, "t_max": 3.0, "slices": 256, "lr": 5e-4, "wd": 0.05, "probe_lr": 1e-3,
                    "probe_wd": 1e-7, "warmup_epochs": 10, "epochs": 100, "global_batch": 4 * 64,
                    "min_lr_ratio": 1e-3, "grad_clip": 1.0}


def reference_sigreg_buffers(knots: int, t_max: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src/sigreg.py's quadrature: t = linspace(0, t_max, knots); trapezoid weights 2 dt (dt at both ends) times the
    window exp(-t^2 / 2), which is also the target characteristic function phi."""
    t = torch.linspace(0, t_max, knots, dtype=torch.float32)
    dt = t_max / (knots - 1)
    w = torch.full((knots,), 2 * dt, dtype=torch.float32)
    w[[0, -1]] = dt
    window = torch.exp(-t.square() / 2.0)
    return t, window, w * window


def test_the_paper_recipes_views_objective_and_optimiser_are_the_references() -> None:
    cfg = load_config(["recipe=paper"])
    r, m, v, o, t = REFERENCE_RECIPE, cfg.model, cfg.views, cfg.objective, cfg.train
    size = SIZES[m.size]
    assert (size.embed_dim, size.depth, size.num_heads) == (r["embed_dim"], r["depth"], r["num_heads"])
    assert (m.patch_size, m.img_size, m.qkv_bias, m.mlp_ratio) == (r["patch_size"], r["img_size"], r["qkv_bias"],
                                                                   r["mlp_ratio"])
    assert (m.drop_path, m.layerscale_init) == (r["drop_path"], r["ls_init"])
    assert (v.n_global, v.n_local, v.global_size, tuple(v.global_scale)) == (r["num_views"], 0, r["img_size"],
                                                                            r["crop_scale"])
    assert (o.proj_hidden, o.proj_out, o.proj_layers) == (r["proj_hidden"], r["proj_dim"], r["proj_linears"])
    assert (o.lamb, o.knots, o.slices) == (r["lamb"], r["knots"], r["slices"])
    sigreg = LeJEPALoss(o).sigreg
    for got, want in zip((sigreg.t, sigreg.phi, sigreg.weights), reference_sigreg_buffers(r["knots"], r["t_max"]),
                         strict=True):
        assert torch.equal(got, want)
    assert sigreg.num_vectors == r["slices"]
    assert (t.lr, t.weight_decay, o.probe_lr, o.probe_weight_decay) == (r["lr"], r["wd"], r["probe_lr"], r["probe_wd"])
    assert (t.warmup_epochs, t.epochs, t.batch_size) == (r["warmup_epochs"], r["epochs"], r["global_batch"])
    assert (t.min_lr_ratio, t.grad_clip) == (r["min_lr_ratio"], r["grad_clip"])
    assert t.decay_all_params and t.warmup_from_zero and o.loss_in_autocast
    assert t.precision == "auto"  # bf16 autocast on CUDA, as --amp


# src/data.py MultiViewTransform, written out: the same transform for every view, the views drawn in turn
def reference_multiview(image_size: int = 224, num_views: int = 4) -> Callable[[Image.Image], torch.Tensor]:
    normalize = transforms.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    transform = transforms.Compose([
        transforms.RandomResizedCrop(image_size, scale=(0.08, 1.0)),
        transforms.RandomApply([transforms.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8),
        transforms.RandomGrayscale(p=0.2),
        transforms.RandomApply([transforms.GaussianBlur(kernel_size=7, sigma=(0.1, 2.0))], p=0.5),
        transforms.RandomApply([transforms.RandomSolarize(threshold=128)], p=0.2),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize,
    ])
    return lambda img: torch.stack([transform(img) for _ in range(num_views)])


def test_the_paper_recipes_view_augmentations_are_the_references_bitwise() -> None:
    """docs/fidelity.md's row "view augmentations": under `recipe=paper` (`views.style=kempner`) the views of a
    photo drawn under a seed are bit for bit the reference's `MultiViewTransform` drawn after `torch.manual_seed` of
    that seed (torchvision's transforms draw from torch's generator alone), directly and through the training set's
    per-sample seeding (`SeededViews`: seed, epoch, index). The draws exercise every branch: each of jitter,
    grayscale, blur, solarize and flip both fires and does not."""
    v = load_config(["recipe=paper"]).views
    assert (v.style, v.backend) == ("kempner", "cpu")
    ours, reference = view_transform(v), reference_multiview()
    images = [natural_image(i, w, h) for i, (w, h) in enumerate([(160, 120), (120, 200), (257, 131)])]
    ops = ("adjust_hue", "rgb_to_grayscale", "gaussian_blur", "solarize", "hflip")  # one call per view that fires
    views = 0
    with contextlib.ExitStack() as stack:
        spies = [stack.enter_context(mock.patch.object(TF, op, wraps=getattr(TF, op))) for op in ops]
        for seed in range(6):
            for img in images:
                torch.manual_seed(seed)
                want = reference(img)
                with seeded_rngs(seed):
                    got = torch.stack(ours(img))
                assert got.dtype == want.dtype and torch.equal(got, want), (seed, img.size)
                views += len(want)
    fired = {op: spy.call_count // 2 for op, spy in zip(ops, spies, strict=True)}  # ours and the reference's
    assert all(0 < n < views for n in fired.values()), (fired, views)
    base = [(img, 0) for img in images]
    train = SeededViews(base, ours, seed=7)
    for epoch in (0, 3):
        train.epoch = epoch
        for i, img in enumerate(images):
            torch.manual_seed(sample_seed(7, epoch, i))
            assert torch.equal(torch.stack(train[i][0]), reference(img)), (epoch, i)


def test_the_default_views_differ_from_the_references_as_the_page_says() -> None:
    """docs/fidelity.md's row "view augmentations", the default column: lightly's DINO views (`views.style=dino`):
    DINO's jitter strengths (ColorJitter 0.4, 0.4, 0.2, 0.1 where the reference's is 0.8, 0.8, 0.8, 0.2), DINO's
    first global view (always blurred, never solarised) and local views (never solarised), the other global views
    solarised with p 0.1 in one draw (the reference: RandomApply p 0.2 around RandomSolarize's own p 0.5, 0.1 in
    effect), DINO's crop scales, bicubic crops (the reference: torchvision's default bilinear) and lightly's blur
    (PIL's GaussianBlur of radius sigma, where the reference samples a 7-px kernel); jitter, grayscale and flip
    probabilities, the blur's sigma range, the threshold and the normalisation are the reference's."""
    v = load_config([]).views
    assert (v.style, v.n_global, v.n_local) == ("dino", 2, 2)
    reference = {"ratio": (3 / 4, 4 / 3), "hflip": 0.5, "jitter": 0.8, "gray": 0.2, "sigmas": (0.1, 2.0),
                 "threshold": 128, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
    dino = {"brightness": (0.6, 1.4), "contrast": (0.6, 1.4), "saturation": (0.8, 1.2), "hue": (-0.1, 0.1)}
    global_, local = (0.3, 1.0), (0.05, 0.3)
    per_view = [{"blur": 1.0, "solarize": 0.0, "scale": global_}, {"blur": 0.5, "solarize": 0.1, "scale": global_},
                {"blur": 0.5, "solarize": 0.0, "scale": local}, {"blur": 0.5, "solarize": 0.0, "scale": local}]
    specs = view_specs(v)  # refuses any crop but bicubic
    assert len(specs) == len(per_view)
    for i, (spec, own) in enumerate(zip(specs, per_view, strict=True)):
        want = {**reference, **dino, **own}
        for k in want:
            assert np.allclose(getattr(spec, k), want[k]), (i, k, getattr(spec, k), want[k])
    for view in view_transform(v).transforms:
        by_name = {type(t).__name__: t for t in view.transform.transforms}
        assert by_name["RandomResizedCrop"].interpolation == transforms.InterpolationMode.BICUBIC
        assert type(by_name["GaussianBlur"]).__module__ == "lightly.transforms.gaussian_blur"
