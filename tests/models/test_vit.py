"""The ViT builder and the attention family, checked against timm and against hand computations."""

import math

import pytest
import timm
import torch
from omegaconf import OmegaConf
from timm.layers import Attention
from timm.models.vision_transformer import VisionTransformer

from tests.helpers.tiny import TINY_VIT
from vitsinks.configs.schema import exp_names, load_config, to_container
from vitsinks.models import (
    ATTN_KINDS,
    GATES,
    KINDS,
    SIZES,
    SinkAttention,
    build_vit,
    load_timm_state_dict,
    model_from_config,
    run_variant,
    variant_name,
)
from vitsinks.models.kinds import AttentionKind, HeadSpec

TINY_MODEL = {"size": "vit_cpu", **TINY_VIT}
EXPS = exp_names()  # every vitsinks/configs/exp/*.yaml


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def timm_vit(**kw) -> VisionTransformer:
    return VisionTransformer(
        img_size=kw.get("img_size", 32), patch_size=kw.get("patch_size", 8), embed_dim=kw.get("embed_dim", 48),
        depth=kw.get("depth", 2), num_heads=kw.get("num_heads", 3), num_classes=0,
        reg_tokens=kw.get("reg_tokens", 0), no_embed_class=kw.get("no_embed_class", False),
        init_values=kw.get("init_values"), dynamic_img_size=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("exp", EXPS)
def test_every_exp_builds_and_trains(exp: str) -> None:
    cfg = load_config([f"exp={exp}", "model.depth=2", "model.img_size=32"])
    model = model_from_config(cfg.model)
    x = torch.randn(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, model.embed_dim)
    out.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert run_variant(cfg) == exp and model.variant == exp.removesuffix("+pen")


@pytest.mark.slow
@pytest.mark.parametrize("size", ["vit_tiny", "vit_small", "vit_base", "vit_large", "vit_huge"])
def test_base_parameter_count_equals_timm(size: str) -> None:
    timm_name = {"vit_huge": "vit_huge_patch14_224"}.get(size, f"{size}_patch16_224")
    with torch.device("meta"):
        ours = build_vit(size)
        ref = timm.create_model(timm_name, pretrained=False, num_classes=0)
    assert n_params(ours) == n_params(ref)


def test_variant_parameter_deltas() -> None:
    d, h, depth, r = TINY_VIT["embed_dim"], TINY_VIT["num_heads"], TINY_VIT["depth"], 4
    base = n_params(build_vit("vit_cpu", **TINY_VIT))
    assert base == n_params(timm_vit())
    assert n_params(build_vit("vit_cpu", **TINY_VIT, registers=r)) - base == r * d
    assert n_params(build_vit("vit_cpu", **TINY_VIT, gate="elementwise")) - base == depth * (d * d + d)
    assert n_params(build_vit("vit_cpu", **TINY_VIT, gate="headwise")) - base == depth * (d * h + h)
    for kind in ATTN_KINDS:  # a kind adds exactly its declared parameters (sink_logit: one logit per head)
        extra = sum(p.numel() for p in KINDS[kind].parameters(HeadSpec(h, d // h)).values())
        assert n_params(build_vit("vit_cpu", **TINY_VIT, attn=kind)) - base == depth * extra
    assert n_params(build_vit("vit_cpu", **TINY_VIT, attn="sink_logit")) - base == depth * h


def test_vit_cpu_preset() -> None:
    m = build_vit("vit_cpu")
    assert (m.embed_dim, len(m.blocks), m.blocks[0].attn.num_heads) == (192, 6, 3)
    assert m.tokens_per_image() == 1 + 8 * 8
    assert SIZES["vit_huge"].patch_size == 14
    mini = build_vit("vit_mini")  # the first run's model
    assert (mini.embed_dim, len(mini.blocks), mini.blocks[0].attn.num_heads) == (128, 4, 4)
    assert mini.tokens_per_image() == 1 + 8 * 8 and sum(p.numel() for p in mini.parameters()) < 1e6


def test_elementwise_gate_scales_output_by_sigmoid2_at_init() -> None:
    torch.manual_seed(0)
    gated = SinkAttention(48, 3, gate="elementwise")
    plain = SinkAttention(48, 3)
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    x = torch.randn(2, 7, 48)
    pre_proj_gated = gated.combine(*_heads(gated, x)) - gated.proj.bias
    pre_proj_plain = plain.combine(*_heads(plain, x)) - plain.proj.bias
    # weight std 1e-6 and bias 2: the gate is sigmoid(2) everywhere, up to ~1e-5
    torch.testing.assert_close(pre_proj_gated, pre_proj_plain * torch.sigmoid(torch.tensor(2.0)), atol=1e-5,
                               rtol=1e-4)


def _heads(attn: SinkAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    a, v, g = attn.internals(x)
    return a @ v, g


def test_registers_are_in_sequence_and_dropped_from_pooled_output() -> None:
    m = build_vit("vit_cpu", **TINY_VIT, registers=3, global_pool="avg")
    x = torch.randn(2, 3, 32, 32)
    tokens = m.forward_features(x)
    assert tokens.shape[1] == 1 + 3 + 16 == m.tokens_per_image()
    cls, regs, patches = m.prefix_and_patches(tokens)
    assert regs.shape == (2, 3, 48)
    # the registers are the learned tokens (no position embedding) going into block 0
    emb = m._pos_embed(m.patch_embed(x))
    torch.testing.assert_close(emb[:, 1:4], m.reg_token.expand(2, -1, -1))
    # the pooled output is the mean of the patch tokens only: registers and [CLS] are dropped
    pooled = m.forward_head(tokens, pre_logits=True)
    torch.testing.assert_close(pooled, m.fc_norm(patches.mean(1)))
    assert not torch.allclose(pooled, m.fc_norm(tokens.mean(1)), atol=1e-3)


def test_relu_attention_zero_when_all_scores_negative() -> None:
    attn = SinkAttention(8, 1, attn="relu", qkv_bias=True)
    with torch.no_grad():
        attn.qkv.weight.zero_()
        attn.qkv.bias.zero_()
        attn.qkv.bias[:8] = 1.0  # q = 1
        attn.qkv.bias[8:16] = -1.0  # k = -1: every score is -8/sqrt(8) < 0
        attn.qkv.bias[16:] = 3.0  # nonzero values
        attn.proj.bias.zero_()
    x = torch.randn(1, 5, 8)
    assert torch.equal(attn.internals(x).attn, torch.zeros(1, 1, 5, 5))
    assert torch.equal(attn(x), torch.zeros(1, 5, 8))


def test_relu_and_sigmoid_match_hand_formula() -> None:
    torch.manual_seed(1)
    x = torch.randn(1, 6, 8)
    formulas = [("relu", lambda s, n: torch.relu(s) / n), ("sigmoid", lambda s, n: torch.sigmoid(s - math.log(n)))]
    for kind, fn in formulas:
        attn = SinkAttention(8, 2, attn=kind)
        q, k, _ = attn.qkv(x).reshape(1, 6, 3, 2, 4).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / 2.0
        torch.testing.assert_close(attn.internals(x).attn, fn(s, 6))


def test_sink_logit_rows_sum_below_one() -> None:
    torch.manual_seed(0)
    attn = SinkAttention(48, 3, attn="sink_logit")
    with torch.no_grad():
        attn.sink_logit.copy_(torch.tensor([0.0, 2.0, -2.0]))
    a = attn.internals(torch.randn(2, 9, 48)).attn
    assert a.shape[-1] == 10  # the tokens, then the null key (the key layout's last slot)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 3, 9))
    rows = a[..., :-1].sum(-1)  # on the tokens
    assert (rows < 1).all() and (rows > 0).all()
    # larger null logit -> less mass on real tokens
    assert rows[:, 1].mean() < rows[:, 0].mean() < rows[:, 2].mean()


def naive_attention(attn: SinkAttention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """SPEC's formulas written out per image, head and query with plain tensor ops, from the module's weights only:
    scores s_ij = q_i . k_j / sqrt(d); the kind's naive formula (`AttentionKind.reference`: softmax, relu(s) / N,
    sigmoid(s - log N), softmax over [s_i, b_h] without the null column, softpick, ...); future keys masked when
    causal; the kind's head output; the G1 gate sigmoid(x W_g^T + b_g) per channel (elementwise) or per head
    (headwise); then the output projection. A kind with its own scores (differential attention's two maps per head)
    forms them from q_i and the keys, and its head output is its own: the kind's tests check both by hand."""
    B, N, C = x.shape
    H = attn.num_heads
    d = C // H
    W, bias = attn.qkv.weight, attn.qkv.bias
    kind = KINDS[attn.attn_kind]
    heads = torch.zeros(B, H, N, d)
    for b in range(B):
        qkv = x[b] @ W.T + (bias if bias is not None else 0)
        for h in range(H):
            q, k, v = (qkv[:, j * C + h * d : j * C + (h + 1) * d] for j in range(3))
            for i in range(N):
                keys = range(i + 1) if causal else range(N)
                if kind.scores is AttentionKind.scores:
                    s = torch.stack([q[i] @ k[j] / math.sqrt(d) for j in keys])
                else:
                    s = kind.scores(attn, q[i].view(1, 1, 1, d), k[: len(keys)].view(1, 1, -1, d))[0, 0, ..., 0, :]
                a = kind.reference(attn, s.double(), h, N)[: len(keys)].float()
                heads[b, h, i] = sum(a[t] * v[j] for t, j in enumerate(keys))
    heads = kind.head_output(attn, heads)
    out = torch.zeros(B, N, C)
    for b in range(B):
        gate = None if attn.gate is None else torch.sigmoid(x[b] @ attn.gate.weight.T + attn.gate.bias)
        for h in range(H):
            for i in range(N):
                y = heads[b, h, i]
                if gate is not None:
                    y = y * (gate[i, h * d : (h + 1) * d] if attn.gate_kind == "elementwise" else gate[i, h])
                out[b, i, h * d : (h + 1) * d] = y
    return out @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize("kind", ATTN_KINDS)
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_a_naive_reference(kind: str, gate: str, causal: bool) -> None:
    torch.manual_seed(0)
    attn = SinkAttention(12, 3, attn=kind, gate=gate, qkv_bias=True).eval()
    with torch.no_grad():
        if attn.gate is not None:  # an input-dependent gate, different per channel and head
            torch.nn.init.normal_(attn.gate.weight, std=1.0)
        for i, name in enumerate(attn.kind_parameter_names):  # the kind's own parameters away from their init
            p = getattr(attn, name)  # (sink_logit's null logits: -1, 0.5, 2)
            p.copy_(torch.linspace(-1.0, 2.0, p.numel()).view_as(p) * 0.5**i)
    x = torch.randn(2, 5, 12)
    ref = naive_attention(attn, x, causal)
    for fused in (True, False):  # the module's fused (SDPA) path where it has one, and its explicit path
        attn.fused_attn = fused
        torch.testing.assert_close(attn(x, is_causal=causal), ref, atol=1e-5, rtol=1e-4)
    assert attn.uses_fused == (KINDS[kind].fused and attn.fused_attn)


@pytest.mark.parametrize("kind", ATTN_KINDS)
def test_rows_of_every_kind_sum_as_it_declares(kind: str) -> None:
    """Normalised kinds: rows sum to 1 over the keys; with a null key, to less over the tokens."""
    torch.manual_seed(0)
    attn = SinkAttention(12, 3, attn=kind, qkv_bias=True)
    for causal in (False, True):
        a = attn.internals(torch.randn(2, 7, 12), causal=causal).attn
        assert a.shape[-1] == 7 + KINDS[kind].null_key  # the tokens, then a null key
        rows = a.sum(-1)
        assert (rows >= 0).all() and torch.isfinite(rows).all()
        if KINDS[kind].null_key:
            assert (a[..., :-1].sum(-1) < 1).all()  # the null key takes the rest
        if KINDS[kind].normalised:
            torch.testing.assert_close(rows, torch.ones_like(rows))


def test_block_explicit_forward_matches_block_forward() -> None:
    torch.manual_seed(0)
    m = build_vit("vit_cpu", **TINY_VIT, gate="elementwise", registers=2, layerscale_init=0.1).eval()
    x = m._pos_embed(m.patch_embed(torch.randn(2, 3, 32, 32)))
    for blk in m.blocks:
        out, it = blk.forward_explicit(x)
        torch.testing.assert_close(out, blk(x), atol=1e-5, rtol=1e-5)
        assert it.attn.shape == (2, 3, x.shape[1], x.shape[1])
        x = out


@pytest.mark.parametrize("layout", ["prefix_pos", "no_embed_class"])
@pytest.mark.parametrize("registers", [0, 4])
def test_timm_state_dict_round_trip(registers: int, layout: str) -> None:
    torch.manual_seed(0)
    ref = timm_vit(reg_tokens=registers, no_embed_class=layout == "no_embed_class", init_values=1e-2).eval()
    with torch.no_grad():  # make position embeddings of every prefix token matter
        ref.pos_embed.normal_()
        if ref.reg_token is not None:
            ref.reg_token.normal_()
    ours = build_vit("vit_cpu", **TINY_VIT, registers=registers, layerscale_init=1e-2).eval()
    load_timm_state_dict(ours, ref.state_dict())
    for size in (32, 48):  # native size and a resampled position embedding
        x = torch.randn(2, 3, size, size)
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=1e-5)


def test_the_reference_register_layout_is_timms_and_its_tokens_start_trunc_normal() -> None:
    torch.manual_seed(0)
    ours = build_vit("vit_cpu", **TINY_VIT, registers=4, register_pos_embed=True, prefix_init_std=0.02).eval()
    assert ours.pos_embed.shape[1] == 1 + 4 + ours.patch_embed.num_patches  # [CLS], registers and patches
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():  # by hand: cat([CLS], registers, patches) + pos_embed over all of them
        by_hand = torch.cat([ours.cls_token.expand(2, -1, -1), ours.reg_token.expand(2, -1, -1),
                             ours.embed_patches(x)], dim=1) + ours.pos_embed
        torch.testing.assert_close(ours.embed_tokens(x), by_hand)
    ref = timm_vit(reg_tokens=4, no_embed_class=False).eval()  # timm's own layout, loaded without conversion
    load_timm_state_dict(ours, ref.state_dict())
    torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=1e-5)
    big = build_vit("vit_cpu", registers=4, prefix_init_std=0.02)
    tokens = torch.cat([big.cls_token.flatten(), big.reg_token.flatten()])
    assert abs(float(tokens.std()) - 0.02) < 0.003  # trunc-normal with torch's default bounds +-2, as the reference
    assert float(build_vit("vit_cpu", registers=4).reg_token.std()) < 1e-5  # timm's default: normal std 1e-6


def test_state_dict_of_another_architecture_is_a_clear_error() -> None:
    ours = build_vit("vit_cpu", **TINY_VIT)
    ref = timm_vit(embed_dim=96)
    with pytest.raises(ValueError, match="the state dict holds a ViT of width 96, .*; the model asked for has width 4"):
        load_timm_state_dict(ours, ref.state_dict())


def test_unknown_variant_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown gate"):
        build_vit("vit_cpu", gate="sideways")
    with pytest.raises(ValueError, match="unknown model size"):
        build_vit("vit_giant")
    with pytest.raises(ValueError, match="unknown attention kind 'tanh'; choose one of .*softpick"):
        build_vit("vit_cpu", attn="tanh")
    with pytest.raises(TypeError, match="unknown arguments \\['gating'\\]"):
        build_vit("vit_cpu", gating="elementwise")


@pytest.mark.parametrize("overrides, name", [
    (["exp=base", "model.gate=elementwise"], "gate"),
    (["exp=softpick", "model.registers=4"], "softpick+reg"),
    (["exp=base", "model.registers=2", "model.gate=headwise"], "gate_headwise+reg2"),
    (["exp=gate+reg", "model.attn=relu", "model.global_pathway.enabled=true"], "relu+gate+reg+global"),
    (["exp=reg", "objective.cm_penalty=0.1", "model.global_pathway.enabled=true"], "reg+global+pen"),
])
def test_a_run_is_named_by_its_model_not_its_exp(overrides: list[str], name: str) -> None:
    cfg = load_config(overrides)
    assert run_variant(cfg) == name and run_variant(to_container(cfg)) == name
    assert model_from_config(OmegaConf.merge(cfg.model, TINY_MODEL)).variant == name.removesuffix("+pen")
    assert variant_name({"gate": "elementwise"}) == "gate"  # absent fields: the schema defaults


@pytest.mark.parametrize("kw", [{}, {"gate": "elementwise"}, {"attn": "softpick", "registers": 4},
                                {"gate": "headwise", "global_pathway": {"gate": "hier"}, "attn": "sink_logit"}])
def test_timm_create_model_builds_the_same_module_as_build_vit(kw: dict) -> None:
    ours = build_vit("vit_cpu", **TINY_VIT, **kw)
    via_timm = timm.create_model("vitsinks_vit_cpu", **TINY_VIT, **kw)
    assert type(via_timm) is type(ours) and via_timm.variant == ours.variant
    assert {k: v.shape for k, v in via_timm.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}
    assert set(timm.list_models("vitsinks_*")) == {f"vitsinks_{s}" for s in SIZES}


def test_the_attention_is_timms_attn_layer_and_the_block_runs_timms_forward_without_hooks() -> None:
    model = build_vit("vit_cpu", **TINY_VIT, gate="elementwise", attn="relu")
    assert not any(type(m) is Attention for m in model.modules())  # timm's attention is never built
    blk = model.blocks[0]
    assert isinstance(blk.attn, SinkAttention) and (blk.attn.gate_kind, blk.attn.attn_kind) == ("elementwise", "relu")
    assert type(blk.attn) is type(model.blocks[1].attn)  # one layer class per (kind, gate)
    calls: list[int] = []
    blk.attn.register_forward_hook(lambda m, a, o: calls.append(1))
    x = torch.randn(2, 17, 48)
    blk(x)
    assert calls == [1]  # timm's Block.forward calls the attention module
    handle = blk.register_update_hook(lambda b, u, p: None)
    blk(x)
    assert calls == [1]  # with a hook the block runs its own forward (heads, then the update)
    handle.remove()
    blk(x)
    assert calls == [1, 1]


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("pathway", [False, True])
def test_update_hooks_see_the_attention_update_after_the_gate_and_before_the_pathway(gate: str, pathway: bool) -> None:
    torch.manual_seed(0)
    model = build_vit("vit_cpu", **TINY_VIT, gate=gate, layerscale_init=0.5,
                      global_pathway={"state_dim": 8} if pathway else None).eval()
    blk = model.blocks[0]
    if blk.attn.gate is not None:  # an input-dependent gate
        torch.nn.init.normal_(blk.attn.gate.weight, std=1.0)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    handle = blk.register_update_hook(lambda b, u, pre: seen.append((u, pre())))
    x = torch.randn(2, 17, 48)
    with torch.no_grad():
        z = blk.norm1(x)
        a, v, g = blk.attn.internals(z)
        by_hand = blk.ls1(blk.attn.combine(a @ v, g))
        ungated = blk.ls1(blk.attn.combine(a @ v, None))
        for run in (lambda: blk(x), lambda: blk.forward_explicit(x), lambda: blk.from_heads(x, a @ v, g)):
            before = len(seen)
            run()
            assert len(seen) == before + 1  # fused forward, explicit forward and from_heads alike
            update, pre = seen[-1]
            torch.testing.assert_close(update, by_hand, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(pre, ungated, atol=1e-5, rtol=1e-5)
        assert (gate == "none") == torch.equal(seen[-1][0], seen[-1][1])
        out = blk(x)
        o = by_hand if not pathway else blk.pathway.add_to(by_hand, z)
        torch.testing.assert_close(out, x + o + blk.ls2(blk.mlp(blk.norm2(x + o))), atol=1e-5, rtol=1e-5)
    handle.remove()
    blk(x)
    assert len(seen) == 4
