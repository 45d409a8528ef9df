"""Which blocks sinks are counted in, and which heads are selected from, against the reference's own rules written
out here (KempnerInstitute/attention_sink, commit a83cd59), never imported from vitsinks:

- `lejepa_sinks/sink_table.py` `count`: block 0's events are dropped (`e[:, 0] = False`) unless `--include_block0`,
  whatever the depth, so a one-block model counts 0 sinks per image; events summed over blocks and heads, averaged
  over images, split by class (broadcast `ratio_head >= 0.5`, no-op `<= 0.2`) and by token ([CLS] 0, register
  1..R, patch > R);
- `vit_causal/select_heads.py`: per class, heads with >= min_events events, ranked by count, the top k_blk0 of block
  0 and the top k_deep of blocks 1..L-1: block 0 is a group of its own in every model;
- `vit_causal/analyze.py`: a head of block 0 is reported under "block 0", the others under "layers >= 1".

Under the reference presets (`diagnostics.block0_policy=always_apart`) vitsinks counts and selects the same; by
default (`one_block_counts`) a one-block model's only block is its main scope, and the tables say so."""

from __future__ import annotations

import numpy as np
import pytest

from vitsinks.configs.schema import load_config
from vitsinks.diagnostics import SinkRules, summarize
from vitsinks.diagnostics.sinktable import sink_table
from vitsinks.interventions.engine import select_heads
from vitsinks.interventions.report import METRICS, by_class, scope_of

N_REG = 2  # token 0 [CLS], 1..2 registers, 3.. patches


# --- the reference, written out ---------------------------------------------------------------------------------
def reference_events(z: dict[str, np.ndarray], rule: str, eps: float | None) -> np.ndarray:
    """sink_table.py `sink_events`: relaxed `routed_frac >= 0.9`, Definition 1 `min_a >= 1 - eps`."""
    return z["routed_frac"] >= 0.9 if rule == "relaxed" else z["min_a"] >= 1.0 - eps


def reference_count(z: dict[str, np.ndarray], events: np.ndarray, include_block0: bool = False) -> dict[str, float]:
    """sink_table.py `count` (bc_ratio 0.5, nop_ratio 0.2)."""
    e = events.copy()
    if not include_block0:
        e[:, 0] = False  # block 0 dropped, in a one-block model too
    rh, si = z["ratio_head"], z["sink_idx"]
    on_cls, on_patch = si == 0, si > N_REG
    out = {}
    for name, m in (("total", e), ("bc", e & (rh >= 0.5)), ("nop", e & (rh <= 0.2))):
        out[name] = float(m.sum((1, 2)).mean())
        out[f"{name}_patch"] = float((m & on_patch).sum((1, 2)).mean())
        out[f"{name}_cls"] = float((m & on_cls).sum((1, 2)).mean())
        out[f"{name}_reg"] = float((m & ~on_cls & ~on_patch).sum((1, 2)).mean())
    return out


def reference_select(z: dict[str, np.ndarray], min_events: int, k_deep: int, k_blk0: int) -> dict[str, list]:
    """select_heads.py with common.py's `event_class` (routed_frac >= 0.9; NOP ratio_out <= 0.2; broadcast
    ratio_out >= 0.5 and stable rank <= 1.5): {group: [(layer, head), ...]}."""
    ev = z["routed_frac"] >= 0.9
    cls = np.full(z["ratio_out"].shape, "other", dtype=object)
    cls[z["ratio_out"] <= 0.2] = "nop"
    cls[(z["ratio_out"] >= 0.5) & (z["stable_rank"] <= 1.5)] = "broadcast"
    cls[~ev] = "none"
    heads = {}
    for c in ("nop", "broadcast"):
        cnt = (cls == c).sum(0)
        for grp, lo, hi, k in ((f"{c}_blk0", 0, 1, k_blk0), (c, 1, cnt.shape[0], k_deep)):
            items = sorted(((int(cnt[b, h]), b, h) for b in range(lo, hi) for h in range(cnt.shape[1])
                            if cnt[b, h] >= min_events), reverse=True)[:k]
            heads[grp] = [(b, h) for _, b, h in items]
    return heads


# --- hand-made per-image fields ---------------------------------------------------------------------------------
def one_block() -> dict[str, np.ndarray]:
    """4 images x 1 block x 2 heads (the sink tasks' shape). Head 0 is a sink on every image (routed_frac 1.0 or
    exactly 0.9): [CLS] NOP (0.1), a patch broadcast (exactly 0.5), a register unclassified (0.3), a patch NOP
    (exactly 0.2); head 1 only on image 2 (a register, broadcast 0.9), below the rule elsewhere (0.89)."""
    return {
        "routed_frac": np.array([[[1.0, 0.2]], [[0.9, 0.89]], [[1.0, 0.95]], [[0.95, 0.0]]]),
        "min_a": np.array([[[0.95, 0.1]], [[0.55, 0.3]], [[0.75, 0.92]], [[0.6, 0.0]]]),
        "ratio_head": np.array([[[0.1, 1.0]], [[0.5, 1.0]], [[0.3, 0.9]], [[0.2, 0.4]]]),
        "sink_idx": np.array([[[0, 5]], [[7, 3]], [[1, 2]], [[4, 0]]]),
    }


def three_blocks(n: int = 8, heads: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """n images x 3 blocks x `heads` heads, values on a grid that hits every threshold exactly (0.9, 1 - eps, 0.2,
    0.5) and sink tokens on [CLS], both registers and patches."""
    rng = np.random.default_rng(seed)
    shape = (n, 3, heads)
    return {
        "routed_frac": rng.choice([0.0, 0.85, 0.89, 0.9, 0.95, 1.0], shape),
        "min_a": rng.choice([0.0, 0.45, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95], shape),
        "ratio_head": rng.choice([0.05, 0.2, 0.21, 0.35, 0.49, 0.5, 1.0, 3.0], shape),
        "sink_idx": rng.integers(0, 6, shape),
    }


def full(z: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`z` with the other per-image arrays `summarize` reads (neutral values)."""
    n, blocks, heads = z["routed_frac"].shape
    return {**z, "ratio_out": z["ratio_head"].copy(), "stable_rank": np.ones((n, blocks, heads)),
            "mass": np.full((n, blocks, heads), 0.5), "num_registers": np.array(N_REG),
            "massive_token": np.zeros((n, blocks), int), "massive_ratio": np.ones((n, blocks)),
            "token_norm_max": np.ones((n, blocks)), "qk_sigma1_frac": np.full((blocks, heads), 0.5),
            "qk_sigma1_over_sigma2": np.ones((blocks, heads)), "recompute_error": np.zeros(blocks)}


MODELS = {"one_block": one_block, "three_blocks": three_blocks}
RULES = [("relaxed", None), ("def1", 0.5), ("def1", 0.3), ("def1", 0.2), ("def1", 0.1)]  # the table's rows
COLUMNS = [f"{c}{p}" for c in ("total", "bc", "nop") for p in ("", "_patch", "_cls", "_reg")]


def table_rows(z: dict[str, np.ndarray], rules: SinkRules, block0: bool) -> dict[tuple, dict]:
    t = sink_table(full(z), block0=block0, block0_policy=rules.block0_policy)
    return {(r["rule"], r["eps"]): r for r in t["rows"]}


@pytest.mark.parametrize("include_block0", [False, True])
@pytest.mark.parametrize("model", list(MODELS))
def test_the_sink_table_preset_counts_the_references_blocks(model: str, include_block0: bool) -> None:
    cfg = load_config(["selection=kempner_sinktable", f"diagnostics.block0={include_block0}"])
    rules = SinkRules.from_config(cfg.diagnostics)
    z = MODELS[model]()
    rows = table_rows(z, rules, bool(cfg.diagnostics.block0))
    assert list(rows) == RULES
    for rule, eps in RULES:
        want = reference_count(z, reference_events(z, rule, eps), include_block0)
        got = rows[(rule, eps)]
        assert max(abs(got[c] - want[c]) for c in COLUMNS) < 1e-6, (rule, eps, got, want)
    # the summary's sinks per image (the preset's classes: ratio_head alone) are the reference's relaxed count
    want = reference_count(z, reference_events(z, "relaxed", None))
    spi = summarize(full(z), rules)["sinks_per_image"]
    for name, cls in (("total", "all"), ("bc", "broadcast"), ("nop", "nop")):
        for suffix, place in (("", "all"), ("_patch", "patch"), ("_cls", "cls"), ("_reg", "register")):
            assert abs(spi[cls][place] - want[f"{name}{suffix}"]) < 1e-6, (cls, place)


def test_a_one_block_model_counts_its_only_block_by_default_and_none_under_the_preset() -> None:
    """The documented difference: on a one-block model the default counts block 0 (here 1.25 sinks per image under
    the relaxed rule), the reference 0; on a deeper model the two agree."""
    z = one_block()
    preset = SinkRules.from_config(load_config(["selection=kempner_sinktable"]).diagnostics)
    default = SinkRules.from_config(load_config([]).diagnostics)
    assert (preset.block0_policy, default.block0_policy) == ("always_apart", "one_block_counts")
    relaxed = reference_events(z, "relaxed", None)
    assert reference_count(z, relaxed)["total"] == 0.0
    assert table_rows(z, preset, False)[("relaxed", None)]["total"] == 0.0
    by_default = table_rows(z, SinkRules(ratio="ratio_head", use_stable_rank=False), False)
    assert by_default[("relaxed", None)]["total"] == 1.25 == reference_count(z, relaxed, include_block0=True)["total"]
    for rule, eps in RULES:  # the default's count of a one-block model is the reference's with --include_block0
        want = reference_count(z, reference_events(z, rule, eps), include_block0=True)
        assert max(abs(by_default[(rule, eps)][c] - want[c]) for c in COLUMNS) < 1e-6
    deep = three_blocks()
    assert table_rows(deep, preset, False) == table_rows(deep, SinkRules(ratio="ratio_head", use_stable_rank=False),
                                                         False)
    # every output says which blocks it counted
    t_default, t_preset = (sink_table(full(z), block0_policy=p) for p in ("one_block_counts", "always_apart"))
    assert t_default["blocks_counted"] == "0 (the only block)"
    assert t_preset["blocks_counted"] == "1..L-1 (none: block 0 is the only block)"
    s_default, s_preset = summarize(full(z), default), summarize(full(z), preset)
    assert s_default["rule"]["blocks_counted"] == "0 (the only block)" and "block0_policy" not in s_default["rule"]
    assert s_preset["rule"]["blocks_counted"] == t_preset["blocks_counted"]
    assert s_preset["rule"]["block0_policy"] == "always_apart"
    assert SinkRules.from_record(s_preset["rule"]) == preset
    assert s_preset["sinks_per_image"]["all"]["all"] == 0.0 and s_default["sinks_per_image"]["all"]["all"] == 1.25
    assert s_preset["sinks_per_image_block0"] == s_default["sinks_per_image_block0"]  # block 0 is still reported


def counts_fields(counts: dict[tuple[int, int], tuple[int, int]], n_blocks: int, heads: int = 6,
                  n: int = 160) -> dict[str, np.ndarray]:
    """n images x n_blocks x heads; head (b, h) has `counts[(b, h)]` = (NOP events, broadcast events), all distinct
    (the reference breaks ties by the larger block and head, vitsinks by the smaller: no tie straddles a cut)."""
    shape = (n, n_blocks, heads)
    z = {"routed_frac": np.zeros(shape), "min_a": np.zeros(shape), "ratio_out": np.full(shape, 0.35),
         "ratio_head": np.full(shape, 0.35), "stable_rank": np.ones(shape), "sink_idx": np.zeros(shape, int)}
    for (b, h), (nop, bc) in counts.items():
        z["routed_frac"][: nop + bc, b, h] = 1.0
        z["ratio_out"][:nop, b, h] = 0.1
        z["ratio_out"][nop : nop + bc, b, h] = 0.9
    return z


SELECTION_MODELS = {
    "one_block": (1, {(0, h): (51 + 3 * h, 0 if h % 2 else 60 + h) for h in range(6)}),
    "three_blocks": (3, {**{(0, h): (70 + h, 0) for h in range(6)}, **{(1, h): (55 + h, 80 - h) for h in range(6)},
                         (2, 0): (49, 50), (2, 3): (85, 0)}),
}


@pytest.mark.parametrize("model", list(SELECTION_MODELS))
def test_the_causal_preset_selects_the_references_heads(model: str) -> None:
    cfg = load_config(["selection=kempner_causal"])
    rules, st = SinkRules.from_config(cfg.diagnostics), cfg.intervene
    n_blocks, counts = SELECTION_MODELS[model]
    z = counts_fields(counts, n_blocks)
    assert (z["routed_frac"].sum(0) == [[sum(counts.get((b, h), (0, 0))) for h in range(6)]
                                        for b in range(n_blocks)]).all()  # every count fits in the images
    ref = reference_select(z, st.min_events, st.top_k, st.top_k_block0)
    got = select_heads(z, rules, st.min_events, st.top_k, st.top_k_block0)
    assert sorted(got) == sorted({bh for group in ref.values() for bh in group})
    # reported as the reference's analyze.py does: block 0 apart from layers >= 1
    for group, bh in ((g, bh) for g, heads in ref.items() for bh in heads):
        assert scope_of(bh[0], n_blocks, rules.block0_policy) == ("block 0" if group.endswith("_blk0")
                                                                  else "blocks 1..L-1")
    if n_blocks == 1:  # by default the only block is the main scope: its top 16 rather than the reference's top 4
        default = select_heads(z, SinkRules(), st.min_events, st.top_k, st.top_k_block0)
        assert len(ref["nop_blk0"]) == st.top_k_block0 and len(got) == 5 < len(default) == 6
        assert scope_of(0, 1) == "block 0 (only)"
        rows = [{"block": 0, "head": h, "edit": "zero_sink_value", "event_class": "nop", "n": 60,
                 **dict.fromkeys(METRICS, 0.5)} for h in range(2)]
        assert list(by_class(rows, 20, 1, rules.block0_policy)) == ["block 0"]
        assert list(by_class(rows, 20, 1)) == ["block 0 (only)"]
