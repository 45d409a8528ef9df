"""The contract of the registries, tested generically: every attention kind (`KINDS`) with every block mitigation
(`MITIGATIONS`, switched on by its `example`) builds, trains a step, runs the same function on every kernel it has
and keeps the key layout; a sink planted at every key of the layout ([CLS], a register, a patch, each extra key slot)
is found, located, summarised, plotted, put on the checkpoint page and intervened on; the registries' entries reach
the config schema and the names derived from them. Nothing here lists a kind, a mitigation or a column by hand."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.tiny import TINY, images, tiny_vit
from vitsinks.backbones import adapt
from vitsinks.configs.schema import DiagnosticsConfig, InterveneConfig, load_config
from vitsinks.diagnostics import run_diagnostics
from vitsinks.diagnostics.summary import mitigation_measures
from vitsinks.interventions import intervene
from vitsinks.interventions.edits import MODEL_EDITS, resolve_edits
from vitsinks.models import ATTN_KINDS, KINDS, MITIGATIONS, SinkAttention, SinkViT, arch_keys, model_from_config
from vitsinks.models.attention import select_kernel, set_fused_attention
from vitsinks.models.config import Attn, ModelConfig, variant_name
from vitsinks.models.kinds import HeadSpec
from vitsinks.models.layout import NULL_SLOT, TOKEN_LOCATIONS, KeyLayout
from vitsinks.models.mitigations import (
    SINK_VALUE_EDITS,
    BlockMitigation,
    SwitchMitigation,
    at_site,
    brought_edits,
    mitigation_columns,
    settings,
    slot_edits,
)
from vitsinks.utils.results import Column
from vitsinks.utils.rundir import PER_IMAGE

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

# (kind, mitigation or None): every kind alone and with every mitigation switched on by its example
COMBOS = [(k, m) for k in ATTN_KINDS for m in (None, *MITIGATIONS)]


def _id(combo: tuple[str, str | None]) -> str:
    return f"{combo[0]}+{combo[1] or 'none'}"


def _vit(kind: str, mitigation: str | None, **overrides: Any) -> SinkViT:
    """The tiny ViT (2 blocks, 3 heads of 16 channels, 32 px) of `kind` with `mitigation` at its example."""
    torch.manual_seed(0)
    on = {} if mitigation is None else {mitigation: MITIGATIONS[mitigation].example}
    return tiny_vit(attn=kind, **on, **overrides)


def _prefix_tokens(mitigation: str | None) -> int:
    """The learned tokens a mitigation at its example adds in the register slots (`BlockMitigation.prefix_tokens`)."""
    m = None if mitigation is None else MITIGATIONS[mitigation]
    return 0 if m is None else m.prefix_tokens(m.setting(m.example))


def _own_parameters(model: SinkViT, kind: str, mitigation: str | None) -> dict[str, nn.Parameter]:
    """The parameters the kind and the mitigation add (by the state-dict names they declare; a mitigation's prefix
    tokens: the register slots, `reg_token`)."""
    kind_names = set(KINDS[kind].parameters(HeadSpec(1, 16)))
    attr = None if mitigation is None else MITIGATIONS[mitigation].attr
    return {n: p for n, p in model.named_parameters()
            if n.rsplit(".", 1)[-1] in kind_names or (attr is not None and f".{attr}." in f".{n}")
            or (n == "reg_token" and _prefix_tokens(mitigation) > 0)}


# --- 1. every kind x every mitigation: builds, trains, one function on every kernel, the key layout ---------------
@pytest.mark.parametrize("combo", COMBOS, ids=_id)
def test_every_kind_with_every_mitigation_builds_trains_and_keeps_its_layout(combo: tuple[str, str | None]) -> None:
    kind, mitigation = combo
    model = _vit(kind, mitigation)
    if mitigation is not None:
        assert all(MITIGATIONS[mitigation].present(blk) for blk in model.blocks)
    own = _own_parameters(model, kind, mitigation)
    assert bool(own) == bool(KINDS[kind].parameters(HeadSpec(1, 16)) or mitigation is not None)
    x = images(4)

    # one training step: every trainable parameter (the kind's and the mitigation's too) gets a finite gradient
    model.train()
    target = torch.randn(4, model.tokens_per_image(), model.embed_dim, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = (model.forward_features(x) * target).mean()
    loss.backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, f"{name} gets no gradient"
            assert torch.isfinite(p.grad).all(), f"{name}: gradient not finite"
    for name, p in own.items():
        # a mitigation's parameters learn where the rows compete (normalised kinds): under relu or sigmoid a key of
        # value 0 (a null key-value register, say) changes nothing, so it rightly gets no gradient there
        if KINDS[kind].normalised or name not in _own_parameters(model, kind, None):
            assert p.grad.abs().sum() > 0, f"the {kind}/{mitigation} parameter {name} does not learn"
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())

    # the forward on every kernel the kind has equals the explicit computation (a mask makes it explicit, like causal)
    model.eval()
    attn = model.blocks[0].attn
    masked = mitigation is not None and MITIGATIONS[mitigation].site == "mask"
    outs = {}
    with torch.no_grad():
        for mode in ("off", "sdpa", "flex"):
            set_fused_attention(model, mode)
            kernel = attn.kernel()
            assert kernel == select_kernel(attn.kind, mode, "cpu", causal=masked, dropout=False, sdpa=attn.fused_attn,
                                           head_dim=attn.head_dim)
            outs[kernel] = model.forward_features(x)
    assert ("flex" in outs) == (KINDS[kind].flex and not masked)
    assert ("sdpa" in outs) == (KINDS[kind].fused and attn.fused_attn and not masked)
    ref = outs["explicit"]
    assert torch.isfinite(ref).all()
    for kernel, out in outs.items():
        err = float((out - ref).abs().max() / ref.abs().max())
        assert err < 1e-5, f"{kernel} differs from the explicit path by {err:.1e} (relative)"

    # the internals follow the key layout
    layout = model.key_layout()
    assert layout == KeyLayout(_prefix_tokens(mitigation), 16, attn.extra_keys)
    assert layout.extra == (*(s for m in at_site("keys") if m.present(model.blocks[0]) for s in m.slots),
                            *((NULL_SLOT,) if KINDS[kind].null_key else ()))
    with torch.no_grad():
        tokens = model.embed_tokens(x)
        assert tokens.shape[1] == layout.n_tokens
        for blk in model.blocks:
            it = blk.attn.internals(blk.norm1(tokens))
            assert it.attn.shape == (4, 3, layout.n_tokens, layout.n_keys)
            assert it.v.shape == (4, 3, layout.n_keys, attn.head_dim)
            if KINDS[kind].normalised:
                torch.testing.assert_close(it.attn.sum(-1), torch.ones(4, 3, layout.n_tokens), rtol=0, atol=1e-5)
            if KINDS[kind].null_key:
                assert not it.v[:, :, -1].any()  # the null key's value is 0
            tokens = blk(tokens)


# --- 2. a sink planted at every key of the layout -----------------------------------------------------------------
# the combinations whose layout has extra key slots, and a plain one; all with a register, so every location is there
# (not with a mask: a key some queries may not see is no sink of every query; tests/models/test_cores.py plants one)
SLOT_COMBOS = [(k, m) for k, m in COMBOS
               if (KINDS[k].null_key and (m is None or MITIGATIONS[m].site != "mask"))
               or (m is not None and MITIGATIONS[m].site == "keys")] + [(ATTN_KINDS[0], None)]
REGISTERS = 1
MARK = 50.0  # a token's marker in its own channel of the residual stream: it dominates the token's normed input
TOKEN_GAIN = 10.0  # the planted head's score of a marked key: ~ TOKEN_GAIN * 6.8 nats above the others
SLOT_GAIN = 50.0  # the planted head's score of an extra key (the other keys score 0)
NULL_GAIN = 30.0  # every key but the null key scores -NULL_GAIN
# (block, head) of the planted sinks, in order: block 1 first (the main scope of the sink counts), then block 0
PLANT_AT = [(1, 0), (1, 1), (1, 2), (0, 0), (0, 1), (0, 2)]


def planted_keys(layout: KeyLayout) -> list[int]:
    """One key per token location ([CLS], the first register, the last patch) and every extra key slot."""
    keys = [0, *([1] if layout.registers else []), layout.n_tokens - 1, *range(layout.n_tokens, layout.n_keys)]
    assert len(keys) <= len(PLANT_AT), "more keys than heads to plant them in: raise the tiny model's heads"
    return keys


def expected_location(layout: KeyLayout, j: int) -> str:
    """Where key `j` sits, written out from the layout's definition: [CLS] | registers | patches | extra slots."""
    if j >= layout.n_tokens:
        return layout.extra[j - layout.n_tokens]
    return TOKEN_LOCATIONS[0 if j == 0 else 1 if j <= layout.registers else 2]


def mark_tokens(model: SinkViT, layout: KeyLayout, channels: dict[int, int]) -> None:
    """Token key j -> channel c: channel c of the embedded tokens is MARK at token j and 0 at every other token
    (in the embeddings of [CLS], the registers and the patches, and in the position embedding)."""
    assert model.pos_embed.shape[1] == 1 + layout.patches  # rows: [CLS], then the patches (registers have none)
    chans = list(channels.values())
    model.patch_embed.proj.weight[chans] = 0.0
    model.patch_embed.proj.bias[chans] = 0.0
    model.pos_embed[..., chans] = 0.0
    model.cls_token[..., chans] = 0.0
    if model.reg_token is not None:
        model.reg_token[..., chans] = 0.0
    for j, c in channels.items():
        if j == 0:
            model.cls_token[0, 0, c] = MARK
        elif j <= layout.registers:
            model.reg_token[0, j - 1, c] = MARK
        else:
            model.pos_embed[0, 1 + j - layout.num_prefix, c] = MARK


def set_slot_key(attn: SinkAttention, slot: str, head: int, key: torch.Tensor) -> None:
    """Make extra slot `slot`'s key of head `head` equal `key`, whatever the keys-site mitigation owning the slot
    keeps (its `keys(batch)` is wrapped: only the contract's interface is used)."""
    for m in at_site("keys"):
        if slot in m.slots:
            module = getattr(attn, m.attr)
            planted = module.__dict__.setdefault("_planted", {})
            if not planted:
                own = module.keys

                def keys(batch: int, own: Any = own, planted: dict = planted) -> tuple[torch.Tensor, torch.Tensor]:
                    k, v = own(batch)
                    k = k.clone()
                    for (h, i), value in planted.items():
                        k[:, h, i] = value.to(k)
                    return k, v

                module.keys = keys
            planted[(head, m.slots.index(slot))] = key.clone()
            return
    raise AssertionError(f"no keys-site mitigation owns slot {slot!r}")


def plant(attn: SinkAttention, head: int, j: int, layout: KeyLayout, channel: int | None) -> None:
    """Make head `head` a sink on key `j`: its queries are u / scale for every token; its token keys G z[channel] u
    (a token key: only the marked token's is large), 0 (an extra slot's key set to G u) or -G u (the null key: every
    other key scores -G, the null logit stays ~0)."""
    dim, hd = attn.qkv.in_features, attn.head_dim
    u = torch.randn(hd, generator=torch.Generator().manual_seed(head))
    u /= u.norm()
    q, k = slice(head * hd, (head + 1) * hd), slice(dim + head * hd, dim + (head + 1) * hd)
    w, b = attn.qkv.weight, attn.qkv.bias
    w[q], b[q], w[k], b[k] = 0.0, u / attn.scale, 0.0, 0.0
    if j < layout.n_tokens:
        w[k] = TOKEN_GAIN * torch.outer(u, torch.eye(dim)[channel])
    elif layout.extra[j - layout.n_tokens] == NULL_SLOT:
        b[k] = -NULL_GAIN * u
        for slot in layout.extra:
            if slot != NULL_SLOT:
                set_slot_key(attn, slot, head, -NULL_GAIN * u)
    else:
        set_slot_key(attn, layout.extra[j - layout.n_tokens], head, SLOT_GAIN * u)


def planted_vit(kind: str, mitigation: str | None) -> tuple[SinkViT, KeyLayout, dict[tuple[int, int], int]]:
    """The tiny ViT with a register and a sink planted at every key of `planted_keys`, each in its own head; returns
    the model, its layout and (block, head) -> the planted key."""
    model = _vit(kind, mitigation, registers=REGISTERS).eval()
    layout = model.key_layout()
    keys = planted_keys(layout)
    tokens = [j for j in keys if j < layout.n_tokens]
    channels = {j: 5 + i for i, j in enumerate(tokens)}
    at = dict(zip(PLANT_AT, keys, strict=False))
    with torch.no_grad():
        mark_tokens(model, layout, channels)
        for (b, h), j in at.items():
            plant(model.blocks[b].attn, h, j, layout, channels.get(j))
    return model, layout, at


@pytest.mark.parametrize("combo", SLOT_COMBOS, ids=_id)
def test_a_sink_planted_at_every_key_is_found_located_shown_and_edited(combo: tuple[str, str | None],
                                                                       tmp_path: Path) -> None:
    kind, mitigation = combo
    model, layout, at = planted_vit(kind, mitigation)
    x = images(8)
    shown = np.zeros((8, 32, 32, 3), np.uint8)

    # the diagnosis: summary, sink table, every plot and the checkpoint page
    out = tmp_path / "diagnostics"
    st = DiagnosticsConfig(plots=True, report=True, residual=True, report_images=2)
    summary = run_diagnostics(model, x[:4], shown[:4], out, st)
    d = dict(np.load(out / PER_IMAGE))
    assert KeyLayout.from_fields(d) == layout
    for (b, h), j in at.items():
        where = f"head {b}:{h} planted on key {j} ({expected_location(layout, j)})"
        assert (d["sink_idx"][:, b, h] == j).all(), f"{where}: found at {d['sink_idx'][:, b, h]}"
        assert (d["mass"][:, b, h] > 0.5).all(), where
        assert (d["routed_frac"][:, b, h] >= 0.9).all(), f"{where}: not a sink event"
        name = expected_location(layout, j)
        assert layout.location(j) == name and KeyLayout.from_fields(d).location(j) == name
        assert summary["location_by_block"][name][b] >= 1.0, f"{where}: {summary['location_by_block']}"
    assert set(summary["location_by_block"]) == set(layout.locations)
    for row in summary["sinks_per_image"].values():
        assert set(layout.locations) <= set(row)
    for j in range(layout.n_tokens, layout.n_keys):  # an extra slot is never counted as a patch
        b = next(b for (b, _), jj in at.items() if jj == j)
        n_on = sum(1 for (bb, _), jj in at.items() if bb == b and expected_location(layout, jj) == "patch")
        assert summary["location_by_block"]["patch"][b] == pytest.approx(n_on)
    pngs = sorted(out.glob("*.png"))
    assert {"attention_maps.png", "sink_heatmap.png", "sink_location_by_block.png"} <= {p.name for p in pngs}
    assert all(p.stat().st_size > 0 for p in pngs)
    assert (out / "report.html").stat().st_size > 0
    page = json.loads((out / "report.json").read_text())
    for shown_image in page["images"]:
        for a in shown_image["attention"]:
            assert set(a.get("extra_keys", {})) == set(layout.extra)

    # the interventions on the planted heads, every default edit
    subject = adapt(model.eval())
    assert subject.mitigations == (() if mitigation is None else (mitigation,))
    heads = sorted(at)
    cfg = InterveneConfig(n_images=4, heldout_images=4, batch_size=4, heads=[f"{b}:{h}" for b, h in heads])
    res = intervene(subject, x[:4], None, x[4:], cfg, progress=False)
    assert res.edits == resolve_edits([], subject.mitigations, subject.num_registers, subject.attn_kinds)
    for (b, h), j in at.items():
        rows = [r for r in res.rows if (r["block"], r["head"]) == (b, h)]
        name = expected_location(layout, j)
        assert {r["sink_idx"] for r in rows} == {j} and {r["sink_loc"] for r in rows} == {name}
        expected = [e for e in res.edits if e not in MODEL_EDITS]
        if j >= layout.n_tokens:  # the sink-value edits that mean nothing on this slot give no rows
            expected = [e for e in expected if e not in SINK_VALUE_EDITS or e in slot_edits(name)]
        assert sorted({r["edit"] for r in rows}) == sorted(expected), f"head {b}:{h} on {name}"
        assert all(sum(r["edit"] == e for r in rows) == 4 for e in expected)
        for r in rows:
            if r["edit"] in ("zero_random_nonsink_value", "donor_nonsink_value"):
                assert layout.num_prefix <= r["random_token"] < layout.n_tokens, r  # a patch, never an extra key
                assert r["edit"] != "zero_random_nonsink_value" or r["random_token"] != r["sink_idx"], r
            else:
                assert r["random_token"] == -1
            assert math.isfinite(r["final_patch_relrms"]), r


# --- 3. the registries reach the schema and the names -------------------------------------------------------------
def _override(name: str, value: Any) -> list[str]:
    """Command-line overrides setting `model.<name>` to a mitigation's example."""
    if isinstance(value, Mapping):
        return [o for k, v in value.items() for o in _override(f"{name}.{k}", v)]
    return [f"model.{name}={str(value).lower() if isinstance(value, bool) else value}"]


def test_every_example_switches_its_mitigation_on_under_its_own_tag() -> None:
    names = {}
    for name, m in MITIGATIONS.items():
        setting = m.setting(m.example)
        assert setting is not None, name
        tag = m.tag(setting)
        assert isinstance(tag, str) and tag, name
        _, f = m.config_field()
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert m.setting(default) is None and m.tag(m.setting(default)) is None, f"{name}: the default is on"
        assert m.arch(m.example) != m.arch(default), name
        names[name] = variant_name({"attn": ATTN_KINDS[0], name: m.example})
        assert tag in names[name].split("+")
    assert len(set(names.values())) == len(names) and "base" not in names.values(), names
    kinds = [variant_name({"attn": k}) for k in ATTN_KINDS]
    assert len(set(kinds)) == len(kinds)
    assert not set(kinds) & set(names.values())


def test_every_kind_and_mitigation_is_in_the_config_schema() -> None:
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(MITIGATIONS) <= fields and set(MITIGATIONS) <= set(arch_keys())
    assert {a.value for a in Attn} == set(ATTN_KINDS)
    tiny = [o for o in TINY if o.startswith("model")]
    every = [o for name, m in MITIGATIONS.items() for o in _override(name, m.example)]
    for kind in ATTN_KINDS:  # a config with every mitigation at its example composes and builds that model
        cfg = load_config([*tiny, f"model.attn={kind}", *every])
        model = model_from_config(cfg.model)
        assert all(blk.attn.attn_kind == kind for blk in model.blocks)
        for m in MITIGATIONS.values():
            assert all(m.present(blk) for blk in model.blocks), (kind, m.name)
        assert model.variant == variant_name(cfg.model)


class _Throwaway(SwitchMitigation):
    """A mitigation that exists only inside a test."""

    name = "contract_throwaway"
    tag_name = "throwaway"
    site = "update"
    attr = "contract_throwaway"
    columns = (Column("contract_throwaway_x", "throwaway x", "mechanism", doc="a test's column"),)
    diagnostic_fields = {"contract_throwaway_x": math.nan}
    edits = ("contract_throwaway_edit",)


@pytest.fixture
def throwaway() -> type[BlockMitigation]:
    """`_Throwaway` registered for the test, removed after it."""
    MITIGATIONS.register(_Throwaway)
    try:
        yield _Throwaway
    finally:
        MITIGATIONS.unregister(_Throwaway.name)


def test_a_registered_mitigation_reaches_what_derives_from_the_registry_at_run_time(throwaway: type) -> None:
    """What reads the registry when called sees a new mitigation: its variant tag (after the ordered ones), setting,
    columns, edits and summary. (`ModelConfig`, the modules `SinkAttention` / `SinkBlock` build and the edit list
    are fixed when vitsinks is imported: a real mitigation is a module of vitsinks.models.mitigations.)"""
    first = next(iter(MITIGATIONS))
    both = variant_name({"attn": ATTN_KINDS[0], first: MITIGATIONS[first].example, throwaway.name: True})
    assert both.split("+")[-1] == "throwaway" and variant_name({throwaway.name: True}) == "throwaway"
    assert settings({})[throwaway.name] is None and settings({throwaway.name: True})[throwaway.name] is True
    assert mitigation_columns()[-1] == throwaway.columns[0]
    assert brought_edits()["contract_throwaway_edit"] is throwaway
    d = {"contract_throwaway_x": np.array([[1.0, np.nan], [3.0, np.nan]])}  # (images, blocks): block 1 lacks it
    summary = mitigation_measures(d | {"num_registers": np.array(0), "num_patches": np.array(16)})
    assert summary["contract_throwaway_x_by_block"] == [2.0, None]
    assert throwaway.leaderboard_values(summary) == {"contract_throwaway_x": 2.0}
    assert MITIGATIONS.register(throwaway) is throwaway  # the same class again: nothing changes
    with pytest.raises(ValueError, match="registered twice"):
        MITIGATIONS.register(type("Twin", (throwaway,), {}))


@pytest.mark.parametrize(("changes", "message"), [
    ({"example": None}, "must be a setting that switches it on"),
    ({"site": "keys"}, "names its key slots"),
    ({"slots": ("x",)}, "names its key slots"),
    ({"site": "nowhere"}, "site must be one of"),
])
def test_registration_refuses_an_incomplete_mitigation(changes: dict[str, Any], message: str) -> None:
    bad = type("Bad", (_Throwaway,), {"name": "contract_bad", **changes})
    with pytest.raises(ValueError, match=message):
        MITIGATIONS.register(bad)
    assert "contract_bad" not in MITIGATIONS
