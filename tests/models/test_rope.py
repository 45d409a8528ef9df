"""The 2D RoPE of the patch tokens (`model.rope`, `vitsinks.models.rope`): q and k of the patches turned as a hand
rotation in float64 says (pairs of channels by row, then by column, positions rescaled to the model's grid), [CLS]
and registers untouched, scores of a model without absolute positions that depend on relative offsets only, and
every reader of the attention (forward on every kernel, internals, redirect, diagnostics) seeing the same q and k."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.helpers.tiny import TINY_VIT, images, tiny_cfg, tiny_vit
from vitsinks.configs.schema import load_config, to_container
from vitsinks.diagnostics.core import diagnose_tokens
from vitsinks.interventions.edits import check_redirect
from vitsinks.models import SinkViT, build_vit, model_from_config, run_variant
from vitsinks.models.attention import SinkAttention, set_fused_attention
from vitsinks.publish.timm_format import unmappable
from vitsinks.train.checkpoint import CheckpointMismatch, check_compatible
from vitsinks.utils.errors import BadValue

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
THETA = 10000.0  # ViT-5's base frequency


def hand_rotated(t: torch.Tensor, grid: tuple[int, int], ref: tuple[int, int], prefix: int) -> torch.Tensor:
    """`t` (B, H, N, hd) with the rows * cols patches after `prefix` tokens turned, in float64, one pair at a time:
    pair p < hd/4 of the patch at (r, c) by the angle r' * THETA^(-p / (hd/4)), pair hd/4 + p by c' * the same, with
    r' = r * ref rows / rows and c' = c * ref cols / cols."""
    t = t.double()
    out = t.clone()
    rows, cols = grid
    quarter = t.shape[-1] // 4
    for i in range(rows * cols):
        r, c = divmod(i, cols)
        for p in range(2 * quarter):
            position = r * ref[0] / rows if p < quarter else c * ref[1] / cols
            angle = position * THETA ** (-(p % quarter) / quarter)
            x0, x1 = t[..., prefix + i, 2 * p], t[..., prefix + i, 2 * p + 1]
            out[..., prefix + i, 2 * p] = x0 * math.cos(angle) - x1 * math.sin(angle)
            out[..., prefix + i, 2 * p + 1] = x0 * math.sin(angle) + x1 * math.cos(angle)
    return out


def unrotated(attn: SinkAttention, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of `attn` on `z` with its RoPE taken out for the call."""
    rope, attn.rope = attn.rope, None
    try:
        return attn._qkv(z)
    finally:
        attn.rope = rope


@pytest.mark.parametrize(("size", "grid"), [(32, (4, 4)), (16, (2, 2)), (24, (3, 3))])
def test_the_patches_q_and_k_turn_as_a_hand_rotation_and_the_prefix_does_not(size: int, grid: tuple[int, int]) -> None:
    """At the model's 32 px the positions are the patch indices; a smaller view's grid is stretched onto the model's
    4 x 4 (positions 0, 2 at 16 px; 0, 4/3, 8/3 at 24 px)."""
    torch.manual_seed(0)
    model = tiny_vit(rope=True, registers=2).double().eval()
    attn = model.blocks[0].attn
    with torch.no_grad():
        x = model.embed_tokens(torch.randn(2, 3, size, size, dtype=torch.float64))
        z = model.blocks[0].norm1(x)
        q, k, v = attn._qkv(z)
        q0, k0, v0 = unrotated(attn, z)
    assert model.rope.grid == grid and x.shape[1] == 3 + grid[0] * grid[1]
    for got, raw in ((q, q0), (k, k0)):
        torch.testing.assert_close(got, hand_rotated(raw, grid, (4, 4), prefix=3), rtol=1e-6, atol=1e-6)
        assert torch.equal(got[:, :, :3], raw[:, :, :3])  # [CLS] and the registers are not turned
        assert not torch.allclose(got[:, :, 4:], raw[:, :, 4:])  # every patch but the first (row 0, col 0) is
    assert torch.equal(v, v0)


def test_a_rope_only_models_scores_depend_on_relative_offsets_only() -> None:
    """Without absolute positions, the score of content a at one patch to content b at another is the same after
    both move by the same offset, and changes when only one moves; every patch holding the same content, the scores
    are a function of the offset between query and key alone."""
    torch.manual_seed(0)
    model = tiny_vit(rope=True, pos_embed="none").double().eval()
    attn, norm = model.blocks[0].attn, model.blocks[0].norm1
    a, b, rest = torch.randn(48, dtype=torch.float64), torch.randn(48, dtype=torch.float64), torch.randn(17, 48)

    def score(at_a: tuple[int, int], at_b: tuple[int, int]) -> torch.Tensor:
        """Every head's score of a (query, at (row, col)) to b (key), the other tokens random."""
        x = rest.double().clone()
        i, j = 1 + 4 * at_a[0] + at_a[1], 1 + 4 * at_b[0] + at_b[1]
        x[i], x[j] = a, b
        q, k, _ = attn._qkv(norm(x[None]))
        return attn.kind.scores(attn, q, k)[0, :, i, j]

    with torch.no_grad():
        s = score((0, 0), (1, 2))
        torch.testing.assert_close(score((2, 1), (3, 3)), s, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(score((1, 1), (2, 3)), s, rtol=1e-10, atol=1e-10)
        assert (score((0, 0), (2, 2)) - s).abs().min() > 1e-3  # another offset, another score
        same = model.blocks[0].norm1(torch.randn(1, 1, 48, dtype=torch.float64).expand(1, 17, 48))
        q, k, _ = attn._qkv(same)
        grid = attn.kind.scores(attn, q, k)[0, :, 1:, 1:]  # (H, 16, 16): patch to patch
    offsets: dict[tuple[int, int], torch.Tensor] = {}
    for i in range(16):
        for j in range(16):
            d = (j // 4 - i // 4, j % 4 - i % 4)
            offsets.setdefault(d, grid[:, i, j])
            torch.testing.assert_close(grid[:, i, j], offsets[d], rtol=1e-10, atol=1e-10)
    assert len({tuple(v.round(decimals=6).tolist()) for v in offsets.values()}) > 1


@pytest.mark.parametrize("kind", ["softmax", "softpick"])
def test_every_kernel_the_internals_and_the_redirect_see_the_same_turned_q_and_k(kind: str) -> None:
    torch.manual_seed(0)
    model = tiny_vit(rope=True, registers=1, attn=kind).eval()
    plain = tiny_vit(registers=1, attn=kind).eval()
    plain.load_state_dict(model.state_dict())  # no weight of its own: the same state dict
    for size in (32, 16):
        x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
        with torch.no_grad():
            outs = {}
            for mode in ("off", "sdpa", "flex"):
                set_fused_attention(model, mode)
                outs[mode] = model.forward_features(x)
            for mode, out in outs.items():
                assert (out - outs["off"]).abs().max() < 1e-5 * outs["off"].abs().max(), (size, mode)
            assert not torch.allclose(outs["off"], plain.forward_features(x))  # the RoPE changes the function
    blk = model.blocks[1]
    with torch.no_grad():
        z = blk.norm1(model.blocks[0](model.embed_tokens(images(2))))
        a = blk.attn.internals(z).attn[:, 0]
        sink = a.mean(-2).argmax(-1)
        redirected = blk.attn.redirected(z, 0, sink)
        rope, blk.attn.rope = blk.attn.rope, None
        unturned = blk.attn.redirected(z, 0, sink)  # from the scores of q and k without the RoPE
        blk.attn.rope = rope
    err, rows = check_redirect(a, redirected, sink, blk.attn)
    assert rows > 0 and err < 1e-4
    assert check_redirect(a, unturned, sink, blk.attn)[0] > 1e-2  # the check tells the scores apart


def test_the_diagnostics_recompute_the_blocks_of_a_rope_model_at_every_view_size() -> None:
    torch.manual_seed(0)
    model = tiny_vit(rope=True, registers=2, qk_norm=True).eval()
    set_fused_attention(model, "sdpa")
    for size in (32, 16):
        x = model.embed_tokens(torch.randn(3, 3, size, size))
        d = diagnose_tokens(model.blocks, x, num_prefix=3)
        assert d["recompute_error"].max() < 1e-5, size
        assert d["mass"].shape == (3, 2, 3)


def test_tokens_embedded_earlier_keep_their_grid_and_a_sequence_no_embedding_made_is_refused() -> None:
    """Blocks run on the tokens of a 32 px batch after a 16 px one was embedded (as gradient checkpointing recomputes
    the global views' blocks after the local views' forward) turn them by the 4 x 4 grid; a sequence of a length no
    embedding made and that the last grid cannot hold is refused in one line."""
    torch.manual_seed(0)
    model = tiny_vit(rope=True).eval()
    with torch.no_grad():
        big = model.embed_tokens(images(1))  # 1 + 16 tokens
        want = model.blocks[0](big)
        model.embed_tokens(torch.randn(1, 3, 16, 16))  # the grid is now 2 x 2
        torch.testing.assert_close(model.blocks[0](big), want, rtol=0, atol=0)
        with pytest.raises(BadValue, match="rotary position embedding holds the 2x2 patch grid") as err:
            model.blocks[0](big[:, :9])
    assert "\n" not in str(err.value)


def test_gradient_checkpointing_over_views_of_two_sizes_gives_the_gradients_of_the_plain_backward() -> None:
    torch.manual_seed(0)
    model = tiny_vit(rope=True, registers=1).train()
    views = [torch.randn(2, 3, 32, 32), torch.randn(4, 3, 16, 16)]
    grads = []
    for checkpointed in (False, True):
        model.zero_grad()
        model.set_grad_checkpointing(checkpointed)
        loss = sum((model.forward_features(v) * (i + 1)).square().mean() for i, v in enumerate(views))
        loss.backward()  # the 32 px blocks are recomputed after the 16 px forward
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_rope_needs_a_head_width_divisible_by_4() -> None:
    with pytest.raises(BadValue, match="divisible by 4, got 6"):
        build_vit("vit_cpu", **{**TINY_VIT, "embed_dim": 18, "num_heads": 3}, rope=True)


def test_rope_adds_no_weight_and_a_checkpoint_of_it_resumes_only_a_rope_run(tmp_path: Path) -> None:
    """The state dicts are alike, so what tells a RoPE checkpoint from another is its run config (`rope` is an
    architecture key): resuming it under a config without RoPE is refused in one line naming the field."""
    assert set(tiny_vit(rope=True).state_dict()) == set(tiny_vit().state_dict())
    assert any("model.rope" in r for r in unmappable(tiny_vit(rope=True)))  # exported in vitsinks' own layout
    ckpt = to_container(tiny_cfg(tmp_path, "model.rope=true"))
    check_compatible(ckpt, to_container(tiny_cfg(tmp_path, "model.rope=true")), tmp_path / "last.pt")
    with pytest.raises(CheckpointMismatch, match="rope: True vs False") as err:
        check_compatible(ckpt, to_container(tiny_cfg(tmp_path)), tmp_path / "last.pt")
    assert "\n" not in str(err.value)


def test_the_exp_files_name_the_modern_baseline_and_a_mitigation_stacks_on_it_and_trains() -> None:
    assert [run_variant(load_config([f"exp={e}"])) for e in ("rope", "qknorm", "qknorm+rope")] == \
        ["rope", "qknorm", "qknorm+rope"]
    cfg = load_config(["exp=gate", "model.qk_norm=true", "model.rope=true", *(f"model.{k}={v}"
                                                                                for k, v in TINY_VIT.items())])
    assert run_variant(cfg) == "gate+qknorm+rope"
    model = model_from_config(cfg.model)
    assert isinstance(model, SinkViT) and model.variant == "gate+qknorm+rope"
    assert all(blk.attn.rope is model.rope and blk.attn.gate is not None for blk in model.blocks)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for size in (32, 16):  # a global and a local view
        loss = model.forward_features(torch.randn(4, 3, size, size)).square().mean()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
        opt.step()
        opt.zero_grad()
