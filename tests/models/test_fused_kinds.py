"""The fused attention paths: each kind's FlexAttention path (`flex_heads`) against the kind's naive formula
(`AttentionKind.reference`, float64) and against the explicit path, forward and backward, and the kernel selection
(`select_kernel`, `model.fused_attention`).

On CPU FlexAttention runs torch's eager reference, forward only through the public API. The backward tests lift that
refusal (the `cpu_flex_backward` fixture, tests/conftest.py): the eager reference's own backward (the joint graph of
the score mod, the gradient of the log-sum-exp) then runs on CPU, which checks the constructions; the compiled CUDA
kernel only a GPU can check.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hydra.errors import ConfigCompositionException

from tests.helpers.tiny import TINY_VIT, tiny_cfg, tiny_vit
from vitsinks.models import KINDS, SinkAttention, model_from_config
from vitsinks.models.attention import FUSED_MODES, select_kernel, set_fused_attention
from vitsinks.models.kinds import FLEX_KINDS
from vitsinks.utils.errors import BadValue

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def attention(kind: str, dim: int = 32, heads: int = 2) -> SinkAttention:
    """A float64 attention of `kind`, its own per-head parameters (sink_logit's null logit) spread over [-1, 2]."""
    torch.manual_seed(0)
    attn = SinkAttention(dim, heads, attn=kind, qkv_bias=True).double()
    with torch.no_grad():
        for name in attn.kind_parameter_names:
            getattr(attn, name).copy_(torch.linspace(-1.0, 2.0, heads))
    return attn


def edge_qkv(n: int, d: int = 16, heads: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 q, k, v (1, heads, n, d), scores mostly within +-10, and three edge queries: 0 (every score exactly
    0), -5 e1 (every score < 0: k's first coordinate is >= 1) and 40 e1 (every score >= 10)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, heads, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    q = 3 * q
    k[..., 0] = k[..., 0].abs() + 1
    q[..., 0, :] = 0.0
    q[..., 1, :] = 0.0
    q[..., 1, 0] = -5.0
    q[..., 2, :] = 0.0
    q[..., 2, 0] = 40.0
    return q, k, v


def naive_heads(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """sum_j A_ij v_j with every row of A from the kind's naive formula on the float64 scores."""
    kind = KINDS[attn.attn_kind]
    s = (q.double() @ k.double().transpose(-2, -1)) * attn.scale
    B, H, n, _ = s.shape
    a = torch.stack([torch.stack([torch.stack([kind.reference(attn, s[b, h, i], h, n)[:n] for i in range(n)])
                                  for h in range(H)]) for b in range(B)])
    return a @ v.double()


def explicit_heads(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The explicit path's per-head outputs: the kind's matrix of the scores, times the values of every key (a null
    key's is 0)."""
    return attn.kind.matrix(attn, (q * attn.scale) @ k.transpose(-2, -1), None) @ attn.key_values(v)


def tol(kind: str) -> float:
    """float64 agreement, relative to the largest entry: rounding, and for softpick its EPS term, which the fused
    path takes at 1 + the sum of the numerators for 1 + their maximum (a relative change <= EPS = 1e-8)."""
    return 3e-8 if kind == "softpick" else 1e-12


def assert_close_at_scale(a: torch.Tensor, b: torch.Tensor, rel: float) -> None:
    """|a - b| <= rel * max |b| everywhere (elementwise relative error is meaningless on entries near 0)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.isfinite(a).all()
    err = float((a - b).detach().abs().max() / b.detach().abs().max())
    assert err <= rel, err


@pytest.mark.parametrize("n", [17, 65])
@pytest.mark.parametrize("kind", FLEX_KINDS)
def test_flex_heads_equal_the_kinds_naive_formula_in_float64(kind: str, n: int) -> None:
    """Including a query whose scores are all 0, one whose scores are all negative (relu and softpick: a zero row)
    and one whose scores are all >= 10."""
    attn = attention(kind)
    q, k, v = edge_qkv(n)
    with torch.no_grad():
        out = KINDS[kind].flex_heads(attn, q, k, v)
    truth = naive_heads(attn, q, k, v)
    assert out.dtype == torch.float64 and out.shape == truth.shape
    if kind == "softpick":  # 0 / 0 in the naive formula on scores all 0; the kind's EPS makes the row 0
        assert truth[..., 0, :].isnan().all() and truth[..., 1:, :].isfinite().all()
        assert (out[..., 0, :] == 0).all() and (explicit_heads(attn, q, k, v)[..., 0, :] == 0).all()
        truth[..., 0, :] = 0.0
    assert_close_at_scale(out, truth, tol(kind))
    nothing = (truth == 0).all(-1)  # rows that attend to nothing (relu, softpick: no positive score): exactly 0
    assert (out[nothing] == 0).all()


@pytest.mark.parametrize("kind", FLEX_KINDS)
def test_flex_heads_cast_to_the_values_dtype_as_under_autocast(kind: str) -> None:
    """float32 queries and keys with bfloat16 values (a qk-norm under autocast): a bfloat16 output within a few
    bfloat16 steps (2^-8) of the float64 one."""
    attn = attention(kind).float()
    q, k, v = (t.float() for t in edge_qkv(17))
    with torch.no_grad():
        out = KINDS[kind].flex_heads(attn, q, k, v.bfloat16())
        truth = KINDS[kind].flex_heads(attn.double(), q.double(), k.double(), v.bfloat16().double())
    assert out.dtype == torch.bfloat16
    assert_close_at_scale(out.double(), truth, 2e-2)


@pytest.mark.parametrize("kind", FLEX_KINDS)
def test_flex_heads_gradients_equal_the_explicit_paths_in_float64(kind: str, cpu_flex_backward: None) -> None:
    attn = attention(kind)
    q, k, v = (t.requires_grad_() for t in edge_qkv(17))
    params = [q, k, v, *(getattr(attn, name) for name in attn.kind_parameter_names)]
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    fused = torch.autograd.grad((KINDS[kind].flex_heads(attn, q, k, v) * g).sum(), params)
    explicit = torch.autograd.grad((explicit_heads(attn, q, k, v) * g).sum(), params)
    for a, b in zip(fused, explicit, strict=True):
        assert_close_at_scale(a, b, tol(kind))


@pytest.mark.slow
@pytest.mark.parametrize("kind", FLEX_KINDS)
def test_the_modules_flex_forward_and_backward_equal_its_explicit_path(kind: str, cpu_flex_backward: None) -> None:
    """The whole attention module (qkv, heads, output projection) in float64, its parameters' gradients too."""
    attn = attention(kind, dim=64)
    x = (3 * torch.randn(2, 17, 64, dtype=torch.float64)).requires_grad_()
    grads = {}
    for mode in ("flex", "off"):
        attn.fused_mode = mode
        assert attn.kernel() == ("flex" if mode == "flex" else "explicit")
        y = attn(x)
        grads[mode] = (y, *torch.autograd.grad(y.square().sum(), [x, *attn.parameters()]))
    for a, b in zip(grads["flex"], grads["off"], strict=True):
        assert_close_at_scale(a, b, tol(kind))


@pytest.mark.slow
@pytest.mark.parametrize("kind", FLEX_KINDS)
def test_a_vit_with_registers_runs_the_same_function_fused(kind: str) -> None:
    """A 2-block ViT in float32, 17 tokens ([CLS] + 16 patches) and, with 4 registers on 64 px inputs, 69."""
    torch.manual_seed(0)
    for registers, px in ((0, 32), (4, 64)):
        model = tiny_vit(attn=kind, registers=registers).eval()
        x = torch.randn(2, 3, px, px, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            set_fused_attention(model, "off")
            ref = model.forward_features(x)
            set_fused_attention(model, "flex")
            assert all(blk.attn.kernel() == "flex" for blk in model.blocks)
            out = model.forward_features(x)
        assert out.shape == (2, 1 + registers + (px // 8) ** 2, 48)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("kind", "mode", "device", "expected"), [
    ("relu", "auto", "cpu", "explicit"),  # CPU: FlexAttention has no backward there
    ("relu", "auto", "cuda", "flex"),
    ("sigmoid", "auto", "cuda", "flex"),
    ("softpick", "auto", "cuda", "flex"),
    ("sink_logit", "auto", "cuda", "flex"),
    ("sink_logit", "auto", "cpu", "sdpa"),
    ("softmax", "auto", "cuda", "sdpa"),  # softmax's best kernel is SDPA's flash attention
    ("softmax", "flex", "cuda", "sdpa"),
    ("relu", "flex", "cpu", "flex"),
    ("sink_logit", "sdpa", "cuda", "sdpa"),
    ("sigmoid", "sdpa", "cuda", "explicit"),
    ("softmax", "off", "cuda", "explicit"),
    ("sink_logit", "off", "cuda", "explicit"),
])
def test_kernel_selection(kind: str, mode: str, device: str, expected: str) -> None:
    args = {"causal": False, "dropout": False, "sdpa": True, "head_dim": 64}
    assert select_kernel(KINDS[kind], mode, device, **args) == expected
    assert select_kernel(KINDS[kind], mode, device, **{**args, "causal": True}) == "explicit"
    # with dropout (and with heads below 16) never flex: what the kind gets without a FlexAttention path
    no_flex = select_kernel(KINDS[kind], mode, device, **{**args, "dropout": True})
    assert no_flex == ("sdpa" if KINDS[kind].fused and expected != "explicit" else "explicit")
    assert select_kernel(KINDS[kind], mode, device, **{**args, "head_dim": 8}) == no_flex
    if expected == "sdpa":  # timm's switch (TIMM_FUSED_ATTN=0) turns SDPA off
        assert select_kernel(KINDS[kind], mode, device, **{**args, "sdpa": False}) == "explicit"


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_module_runs_the_kernel_it_selects_and_its_internals_never_a_fused_one(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every fused kernel replaced by a recorder, the forward calls the selected one (and only it) and
    `internals`, `forward_explicit` and `redirected` (the diagnostics and interventions) call none."""
    calls: list[str] = []
    kind_cls = KINDS[kind]

    def recorder(name: str):
        def record(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: float):
            calls.append(name)
            return torch.zeros_like(v)
        return staticmethod(record)

    monkeypatch.setattr(kind_cls, "flex_heads", recorder("flex"))
    monkeypatch.setattr(kind_cls, "fused_heads", recorder("sdpa"))
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append("F.sdpa"))
    model = tiny_vit(attn=kind, depth=1).eval()
    blk, x = model.blocks[0], torch.randn(2, 17, 48)
    with torch.no_grad():
        for mode in FUSED_MODES:
            set_fused_attention(model, mode)
            kernel = blk.attn.kernel()
            calls.clear()
            blk.attn(x)
            assert calls == ([] if kernel == "explicit" else [kernel])
            calls.clear()
            blk.attn.internals(x)
            blk.forward_explicit(x)
            blk.attn.redirected(x, 0, torch.tensor([0, 3]))
            assert calls == []


def test_the_config_sets_every_blocks_mode_and_bad_modes_are_refused(runs) -> None:
    assert tiny_cfg(runs).model.fused_attention == "auto"
    cfg = tiny_cfg(runs, "model.fused_attention=off")
    model = model_from_config(cfg.model)
    assert [blk.attn.fused_mode for blk in model.blocks] == ["off"] * TINY_VIT["depth"]
    assert not any(blk.attn.uses_fused for blk in model.blocks)
    with pytest.raises(ConfigCompositionException) as err:  # the closed set stops composition, as every enum
        tiny_cfg(runs, "model.fused_attention=fast")
    assert "auto, flex, sdpa, off" in str(err.value.__cause__ or err.value)
    with pytest.raises(BadValue, match="fused_attention"):
        set_fused_attention(model, "fast")


def test_flex_training_on_cpu_is_refused_with_the_fix() -> None:
    attn = SinkAttention(32, 2, attn="relu")
    attn.fused_mode = "flex"
    with warnings.catch_warnings(), pytest.raises(BadValue, match="fused_attention=flex.*auto, sdpa or off"):
        warnings.simplefilter("ignore")
        attn(torch.randn(1, 5, 32))


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled FlexAttention kernel needs CUDA")
@pytest.mark.parametrize("kind", FLEX_KINDS)
def test_the_compiled_cuda_kernel_equals_the_explicit_path_forward_and_backward(kind: str) -> None:
    """On a GPU, auto selects FlexAttention; float32, 197 tokens (ViT-B/16 at 224 px), head_dim 64."""
    attn = attention(kind, dim=256, heads=4).float().cuda()
    x = torch.randn(4, 197, 256, device="cuda", requires_grad=True)
    results = {}
    for mode in ("auto", "off"):
        attn.fused_mode = mode
        assert attn.kernel() == ("flex" if mode == "auto" else "explicit")
        y = attn(x)
        results[mode] = (y, *torch.autograd.grad(y.square().sum(), [x, *attn.parameters()]))
    for a, b in zip(results["auto"], results["off"], strict=True):
        assert_close_at_scale(a, b, 1e-4)
