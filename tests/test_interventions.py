"""Causal interventions (SPEC section 6): edits, metrics and selection against hand computations and the model's own
forward, and the theory's predictions on the synthetic tasks' trained models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vitsinks.config import InterveneConfig
from vitsinks.interventions import from_sequence_model, from_vit, intervene
from vitsinks.interventions.edits import (
    ValueEdit,
    apply_value,
    check_value_edit,
    random_patch,
    redirect,
    resolve_edits,
    value_edit,
)
from vitsinks.interventions.engine import NoSinkHeads, Rules, patch_metrics, probe_metrics, select_heads
from vitsinks.interventions.report import by_class, by_head
from vitsinks.models import build_vit
from vitsinks.synthetic.tasks import broadcast_batch, nop_batch, train_broadcast, train_nop


def test_value_edit_check_matches_the_closed_form_and_catches_a_misplaced_edit() -> None:
    g = torch.Generator().manual_seed(0)
    attn = torch.rand(3, 5, 5, generator=g).softmax(-1)
    v, w = torch.randn(3, 5, 4, generator=g), torch.randn(6, 4, generator=g)
    edit = ValueEdit(torch.tensor([0, 2, 4]), torch.randn(3, 4, generator=g))
    v_new = apply_value(v, edit)
    assert torch.equal(v_new[1, 2], edit.new[1]) and torch.equal(v_new[1, 3], v[1, 3])
    assert check_value_edit(attn, v, v_new, edit, w) < 1e-12
    wrong = apply_value(v, ValueEdit(torch.tensor([1, 2, 4]), edit.new))  # image 0 edited at the wrong token
    assert check_value_edit(attn, v, wrong, edit, w) > 1e-3


def test_redirect_moves_the_sink_column_to_the_other_keys_in_proportion() -> None:
    a = torch.tensor([[[0.5, 0.25, 0.25], [1.0, 0.0, 0.0], [0.2, 0.2, 0.6]]])
    r = redirect(a, torch.tensor([0]))
    assert torch.allclose(r[0, 0], torch.tensor([0.0, 0.5, 0.5]))
    assert torch.equal(r[0, 1], torch.zeros(3))  # nothing else to attend to: stays at zero
    assert torch.allclose(r[0, 2], torch.tensor([0.0, 0.25, 0.75]))
    relu_like = torch.tensor([[[0.3, 0.1, 0.2]]])  # rows that do not sum to 1 keep their sum
    assert torch.allclose(redirect(relu_like, torch.tensor([2])).sum(-1), relu_like.sum(-1))


def test_random_patch_never_picks_the_excluded_token_or_a_prefix_token() -> None:
    g = torch.Generator().manual_seed(0)
    exclude = torch.tensor([0, 3, 7] * 200)
    j = random_patch(exclude, n_tokens=8, num_prefix=2, gen=g)
    assert (j >= 2).all() and (j < 8).all() and (j != exclude).all()
    assert set(j[exclude == 3].tolist()) == {2, 4, 5, 6, 7}  # every other patch is reachable


def test_value_edits_take_the_values_they_name() -> None:
    g = torch.Generator().manual_seed(1)
    v = torch.randn(3, 6, 2, generator=g)
    sink, donor = torch.tensor([0, 4, 2]), torch.tensor([1, 2, 0])
    e = value_edit("donor_sink_value", v, sink, donor, 1, None, g)
    assert torch.equal(e.pos, sink) and torch.equal(e.new, torch.stack([v[1, 4], v[2, 2], v[0, 0]]))
    mean = torch.ones(2)
    assert torch.equal(value_edit("mean_sink_value", v, sink, donor, 1, mean, g).new, torch.ones(3, 2))
    z = value_edit("zero_random_nonsink_value", v, sink, donor, 1, None, g)
    assert (z.pos != sink).all() and (z.pos >= 1).all() and not z.new.any()
    with pytest.raises(ValueError, match="held-out"):
        value_edit("mean_sink_value", v, sink, donor, 1, None, g)


@pytest.mark.parametrize(("requested", "gated", "registers", "message"), [
    (["nope"], False, 0, "unknown edit"), (["open_gate"], False, 4, "needs a gated model"),
    (["drop_registers"], True, 0, "register tokens")])
def test_edits_that_do_not_apply_are_refused(requested: list[str], gated: bool, registers: int,
                                             message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_edits(requested, gated, registers)


def test_default_edits_follow_the_model() -> None:
    assert "open_gate" not in resolve_edits([], False, 0) and "drop_registers" not in resolve_edits([], False, 0)
    assert {"open_gate", "close_gate", "drop_registers"} <= set(resolve_edits([], True, 4))


def test_patch_metrics_against_hand_values() -> None:
    base = torch.zeros(2, 4, 3)
    base[..., 0] = 2.0  # every patch has norm 2
    common = base.clone()
    common[..., 1] += 1.0  # the same change at every patch: fully coherent
    m = patch_metrics(base, common, num_prefix=1, sink=torch.tensor([0, 2]))
    assert torch.allclose(m["final_patch_relrms"], torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert torch.allclose(m["coherence"], torch.ones(2, dtype=torch.float64))
    opposite = base.clone()
    opposite[:, 1, 1] += 1.0
    opposite[:, 2, 1] -= 1.0  # +d and -d: no common part
    m = patch_metrics(base, opposite, num_prefix=1, sink=torch.tensor([0, 0]))
    assert torch.allclose(m["coherence"], torch.zeros(2, dtype=torch.float64))
    assert math.isclose(float(m["final_patch_relrms"][0]), math.sqrt(2 / 3) / 2)
    m = patch_metrics(base, opposite, num_prefix=1, sink=torch.tensor([2, 0]))  # image 0: the sink patch is left out
    assert math.isclose(float(m["final_patch_relrms"][0]), math.sqrt(1 / 2) / 2)
    assert torch.isnan(patch_metrics(base, base, 1, None)["coherence"]).all()  # no change: undefined
    donor_base = base.clone()
    donor_base[1, 1:, 2] = 5.0  # image 1's patches differ from image 0's along axis 2
    moved = donor_base.clone()
    moved[0, 1:, 2] += 1.0  # image 0 moves towards its donor
    m = patch_metrics(donor_base, moved, 1, None, donor=torch.tensor([1, 0]))
    assert math.isclose(float(m["donor_cosine"][0]), 1.0)


def test_probe_metrics_against_hand_values() -> None:
    before = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    m = probe_metrics(before, before, torch.tensor([0, 0]))
    assert torch.equal(m["probe_agree"], torch.ones(2, dtype=torch.float64)) and m["probe_kl"].abs().max() < 1e-12
    assert torch.allclose(m["probe_correct"], torch.tensor([1.0, 0.0], dtype=torch.float64))
    after = torch.tensor([[0.0, 2.0], [0.0, 1.0]])
    m = probe_metrics(before, after, torch.tensor([0, 0]))
    p = torch.tensor([2.0, 0.0], dtype=torch.float64).softmax(0)
    q = torch.tensor([0.0, 2.0], dtype=torch.float64).softmax(0)
    assert math.isclose(float(m["probe_kl"][0]), float((p * (p / q).log()).sum()))
    assert math.isclose(float(m["probe_ce"][0]), -math.log(float(q[0])))
    assert m["probe_agree"].tolist() == [0.0, 1.0]


def _fields(counts: dict[tuple[int, int, int], int], n: int = 60) -> dict[str, np.ndarray]:
    """Fields of n images x 3 blocks x 2 heads with `counts[(block, head, class)]` events (class 0 NOP, 1 broadcast)."""
    d = {"routed_frac": np.zeros((n, 3, 2)), "min_a": np.zeros((n, 3, 2)), "ratio_out": np.full((n, 3, 2), 0.35),
         "stable_rank": np.ones((n, 3, 2))}
    for (b, h, cls), k in counts.items():
        d["routed_frac"][:k, b, h] = 1.0
        d["ratio_out"][:k, b, h] = 0.1 if cls == 0 else 0.9
    return d


def test_head_selection_follows_the_reference_protocol() -> None:
    d = _fields({(1, 0, 0): 55, (2, 1, 0): 58, (2, 0, 1): 51, (0, 1, 0): 52, (1, 1, 0): 49})
    assert select_heads(d, Rules(), 50, 16, 4) == [(2, 1), (1, 0), (0, 1), (2, 0)]  # ranked; 49 events: out
    assert select_heads(d, Rules(), 50, 1, 0) == [(2, 1), (2, 0)]  # top 1 per class, none of block 0
    with pytest.raises(NoSinkHeads, match="most per head: NOP 58, broadcast 51"):
        select_heads(d, Rules(), 59, 16, 4)


def _vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_vit("vit_cpu", img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=2, gate="elementwise",
                     registers=2, layerscale_init=0.5).eval()


def test_zero_sink_value_equals_the_models_own_forward_with_the_closed_form_change() -> None:
    """A second path: the model's own (fused) forward, with a hook that subtracts the sink's contribution
    ls * W_O^h (g_i * A_is v_s) from the edited block's attention output, must give the same final tokens."""
    model, subject, x, d = _setup()
    st = InterveneConfig(n_images=4, heads=["1:1"], edits=["zero_sink_value"], batch_size=4)
    with torch.no_grad():
        blk = model.blocks[1]
        h_in = model.blocks[0](subject.embed(x))
        it = blk.attn.internals(blk.norm1(h_in))
        sink = it.attn[:, 1].mean(-2).argmax(-1)
        hd = blk.attn.head_dim
        contrib = it.attn[torch.arange(4), 1, :, sink].unsqueeze(-1) * it.v[torch.arange(4), 1, sink].unsqueeze(1)
        contrib = contrib * it.gate[:, :, 1]  # (B, N, hd)
        delta = contrib @ blk.attn.proj.weight[:, hd : 2 * hd].T  # before LayerScale, which the block applies
        hook = blk.attn.register_forward_hook(lambda mod, inp, out: out - delta)
        expected = model.norm(model.blocks(subject.embed(x)))  # the model's own forward, through the hook
        hook.remove()
        base = model.norm(model.blocks(subject.embed(x)))
    res = intervene(subject, x, None, x[:0], st, stage1=d, progress=False)
    ours = [r["final_patch_relrms"] for r in res.rows]
    assert np.allclose(ours, _hand_relrms(base, expected, sink.tolist()), rtol=1e-4, atol=1e-7)
    assert min(ours) > 0
    assert float(res.checks.as_dict()["value_edit_error_max"]) < 1e-8
    assert float(res.checks.as_dict()["recompute_error_max"]) < 1e-4


def _setup(with_events: bool = True) -> tuple[torch.nn.Module, object, torch.Tensor, dict[str, np.ndarray]]:
    """The tiny gated ViT with registers, its subject, 4 images and stage-1 fields whose every head is a NOP event
    (or has no event), with the sinks the model really has."""
    model = _vit()
    x = torch.randn(4, 3, 32, 32)
    fill = np.ones if with_events else np.zeros
    d = {"routed_frac": fill((4, 3, 2)), "min_a": fill((4, 3, 2)), "ratio_out": np.zeros((4, 3, 2)),
         "stable_rank": np.ones((4, 3, 2)), "sink_idx": _sinks(model, x)}
    return model, from_vit(model), x, d


def _hand_relrms(base: torch.Tensor, edited: torch.Tensor, sinks: list[int], num_prefix: int = 3) -> np.ndarray:
    """Per image, the rel. RMS change over the patch tokens with the sink token (when it is a patch) left out."""
    out = []
    for i, s in enumerate(sinks):
        keep = [j for j in range(num_prefix, base.shape[1]) if j != s]
        d, p = edited[i, keep] - base[i, keep], base[i, keep]
        out.append(float((d**2).sum(-1).mean().sqrt() / (p**2).sum(-1).mean().sqrt()))
    return np.array(out)


def _sinks(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    """Sink positions of every (image, block, head), computed directly from the explicit attention."""
    out, h = [], model.embed_tokens(x)
    with torch.no_grad():
        for blk in model.blocks:
            h, it = blk.forward_explicit(h)
            out.append(it.attn.mean(-2).argmax(-1))
    return torch.stack(out, 1).numpy()


def test_gate_and_register_edits_change_what_they_should() -> None:
    model, subject, x, d = _setup()
    st = InterveneConfig(n_images=4, heads=["2:0"], edits=["open_gate", "close_gate", "drop_registers"], batch_size=4)
    res = intervene(subject, x, None, x[:0], st, stage1=d, progress=False)
    by_edit = {e: [r["final_patch_relrms"] for r in res.rows if r["edit"] == e] for e in st.edits}
    assert all(v > 0 for vals in by_edit.values() for v in vals)
    assert len(by_edit["drop_registers"]) == 4 and {r["block"] for r in res.rows if r["edit"] == "drop_registers"} \
        == {-1}
    with torch.no_grad():  # close_gate on the model's own forward: its attention output loses head 0's gated part
        blk = model.blocks[2]
        h_in = model.blocks[1](model.blocks[0](model.embed_tokens(x)))
        it = blk.attn.internals(blk.norm1(h_in))
        hd = blk.attn.head_dim
        delta = (it.gate[:, :, 0] * (it.attn[:, 0] @ it.v[:, 0])) @ blk.attn.proj.weight[:, :hd].T
        hook = blk.attn.register_forward_hook(lambda mod, inp, out: out - delta)
        closed = model.norm(model.blocks(model.embed_tokens(x)))
        hook.remove()
        base = model.norm(model.blocks(model.embed_tokens(x)))
    ours = [r["final_patch_relrms"] for r in res.rows if r["edit"] == "close_gate"]
    assert np.allclose(ours, _hand_relrms(base, closed, d["sink_idx"][:, 2, 0].tolist()), rtol=1e-4, atol=1e-7)


def _by_class(rows: list[dict], n_blocks: int) -> dict:
    return by_class(by_head(rows), 20, n_blocks)


@pytest.fixture(scope="module")
def nop_result() -> dict:
    model, _ = train_nop(steps=1500, seed=0)
    x, _, _ = nop_batch(torch.Generator().manual_seed(7), batch=160)
    st = InterveneConfig(n_images=128, heldout_images=32, min_events=20)
    res = intervene(from_sequence_model(model, num_prefix=1), x[:128], None, x[128:], st, progress=False)
    return _by_class(res.rows, 1)["block 0 (only)"]["nop"]


def test_nop_sink_on_the_synthetic_task_is_causally_a_nop(nop_result: dict) -> None:
    """Theory (SPEC section 6): zeroing or mean-replacing a NOP sink's value changes almost nothing, removing the
    attention to it changes a lot."""
    zero, mean = nop_result["zero_sink_value"], nop_result["mean_sink_value"]
    redirect_change = nop_result["redirect_sink_attention"]["final_patch_relrms"]
    assert zero["final_patch_relrms"] < 0.01 and mean["final_patch_relrms"] < 0.01
    assert redirect_change > 10 * max(zero["final_patch_relrms"], mean["final_patch_relrms"])


def test_broadcast_sink_on_the_synthetic_task_moves_every_token_towards_the_donor() -> None:
    model, _ = train_broadcast(steps=1500, seed=0)
    x, _, _ = broadcast_batch(torch.Generator().manual_seed(7), batch=160)
    st = InterveneConfig(n_images=128, heldout_images=32, min_events=20,
                         edits=["zero_sink_value", "donor_sink_value", "redirect_sink_attention"])
    res = intervene(from_sequence_model(model), x[:128], None, x[128:], st, progress=False)
    main = _by_class(res.rows, 2)["blocks 1..L-1"]["broadcast"]
    assert main["zero_sink_value"]["coherence"] > 0.8
    assert main["donor_sink_value"]["donor_cosine"] >= 0.9


def test_named_heads_without_events_and_bad_heads_are_refused() -> None:
    _, subject, x, d = _setup(with_events=False)
    for heads, message in ((["1:0"], "no sink events"), (["1:2"], "head 2 is out of range"),
                           (["5:0"], "block 5 is out of range"), (["x"], "not block:head")):
        with pytest.raises(ValueError, match=message):
            intervene(subject, x, None, x[:0], InterveneConfig(heads=heads, edits=["zero_sink_value"]), stage1=d,
                      progress=False)
    with pytest.raises(NoSinkHeads):  # automatic selection finds nothing and no whole-model edit was asked for
        intervene(subject, x, None, x[:0], InterveneConfig(edits=["zero_sink_value"]), stage1=d, progress=False)


def test_a_model_with_non_finite_weights_is_refused_not_measured() -> None:
    model, subject, x, d = _setup()
    with torch.no_grad():
        model.blocks[2].attn.proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="not finite"):
        intervene(subject, x, None, x[:0], InterveneConfig(heads=["1:0"], edits=["zero_sink_value"]), stage1=d,
                  progress=False)
