"""Sink lifetimes and massive emergence on the planted depth model (`tests.helpers.planted_depth.persistent`), by hand:
in the fields, summary.json, the notebook's tables and the leaderboard's columns; the checkpoint page's panel."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.planted_depth import persistent, planted_norm
from vitsinks.diagnostics import diagnose_tokens, spectrum, summarize
from vitsinks.diagnostics.core import diagnose_chosen
from vitsinks.diagnostics.page import DEPTH_PARTS, _depth_html
from vitsinks.diagnostics.page_figures import num
from vitsinks.diagnostics.persistence import emergence_summary, head_lifetimes, key_lifetimes
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.diagnostics.summary import DiagnosticsSummary, shape_columns
from vitsinks.pretrained.api import tables

CV9 = float(np.std(v := [planted_norm(30), planted_norm(60), planted_norm(60)]) / np.mean(v))  # token 9, blocks 0..2
LIFE = {3: (1, 1), 9: (1, 2)}  # sink token -> (first, last) block


@pytest.fixture(scope="module")
def planted() -> tuple[dict[str, np.ndarray], dict]:
    blocks, x = persistent()
    d = diagnose_tokens(blocks, x)
    d.update(spectrum(blocks), num_registers=np.array(0), num_prefix=np.array(1), num_cls=np.array(1),
             num_patches=np.array(16), grid=np.array([4, 4]), block=np.arange(3))
    return d, summarize(d)


def test_massive_tokens_emerge_where_planted_and_stay(planted: tuple) -> None:
    d, _ = planted
    assert d["massive_new"].tolist() == [[1, 1, 0]] * 2  # token 9 at block 0, token 5 at block 1
    np.testing.assert_allclose(d["massive_cv"][:, 0], CV9, rtol=1e-5)
    np.testing.assert_allclose(d["massive_cv"][:, 1], 0.0, atol=1e-5)  # token 5 keeps its norm
    assert np.isnan(d["massive_cv"][:, 2]).all()  # nothing emerges at the last block


def test_chosen_blocks_count_from_the_first_chosen() -> None:
    blocks, x = persistent()
    d = diagnose_chosen(blocks, x, [1, 2])
    assert d["massive_new"].tolist() == [[2, 0]] * 2  # tokens 9 and 5 are massive in block 1, the first diagnosed
    np.testing.assert_allclose(d["massive_cv"][:, 0], 0.0, atol=1e-5)


def test_sink_lifetimes_follow_each_key(planted: tuple) -> None:
    d, _ = planted
    ev = SinkRules().events(d)
    assert not ev[:, 0].any() and ev[:, 1:].all()
    assert (d["sink_idx"][:, 1:] == [[3, 9, 9], [9, 9, 9]]).all()
    first, last = key_lifetimes(d["sink_idx"], ev, 17)
    for key in range(17):
        assert (first[:, key] == LIFE.get(key, (-1, -1))[0]).all() and (last[:, key] == LIFE.get(key, (-1,))[-1]).all()
    got = head_lifetimes(d["sink_idx"], ev, 17)
    want = np.vectorize(lambda s: LIFE.get(int(s), (-1, -1))[0])(d["sink_idx"])
    np.testing.assert_array_equal(got["sink_first"], want)
    assert got["sink_last"][:, 1].tolist() == [[1, 2, 2]] * 2
    shifted = head_lifetimes(d["sink_idx"], ev, 17, blocks=[4, 7, 9])  # model indices of the diagnosed blocks
    assert shifted["sink_last"][:, 1].tolist() == [[7, 9, 9]] * 2


def test_summary_has_the_planted_numbers(planted: tuple) -> None:
    _, s = planted
    assert s["sink_lifetime"] == {"keys_per_image": 2.0, "mean_span": 1.5,
                                  "span_by_location": {"cls": None, "register": None, "patch": 1.5},
                                  "starts_by_block": [0.0, 2.0, 0.0], "ends_by_block": [0.0, 1.0, 1.0]}
    m = s["massive_emergence"]
    assert (m["k"], m["images_with"], m["first_block"], m["new_by_block"]) == (10.0, 1.0, 0.0, [1.0, 1.0, 0.0])
    assert m["cv_by_block"][0] == pytest.approx(CV9, rel=1e-5) and m["cv_by_block"][2] is None
    assert m["cv"] == pytest.approx(CV9 / 2, rel=1e-4)
    h = s["head_shape"]
    assert set(h) == {"concentration_by_block", "diag_mass_by_block", "head_util_by_block", "dead_by_block",
                      "neg_mass_by_block"}
    assert all(len(v) == 3 for v in h.values())
    assert DiagnosticsSummary.from_json(s).to_json() == s


def test_emergence_summary_without_massive_tokens() -> None:
    m = emergence_summary(np.zeros((2, 3), dtype=int), np.full((2, 3), np.nan))
    assert (m["images_with"], m["first_block"], m["cv"], m["cv_by_block"]) == (0.0, None, None, [None] * 3)


def test_notebook_tables_hold_the_fields(planted: tuple) -> None:
    d, _ = planted
    t = tables(d)
    heads, blocks = t["heads"], t["blocks"]
    for k in ("concentration", "diag_mass", "update_share", "sink_first", "sink_last"):
        assert len(heads[k]) == 2 * 3 * 3, k
    want = head_lifetimes(d["sink_idx"], SinkRules().events(d), 17)
    np.testing.assert_array_equal(heads["sink_first"], want["sink_first"].reshape(-1))
    np.testing.assert_array_equal(heads["sink_last"], want["sink_last"].reshape(-1))
    assert blocks["massive_new"].tolist() == [1, 1, 0] * 2
    np.testing.assert_allclose(blocks["head_util"], d["head_util"].reshape(-1))


def test_leaderboard_columns_summarise_the_variant(planted: tuple) -> None:
    _, s = planted
    row = shape_columns(DiagnosticsSummary.from_json(s))
    assert row["sink_span"] == 1.5 and row["sink_keys"] == 2.0
    assert row["massive_first"] == 0.0 and row["massive_cv"] == pytest.approx(CV9 / 2, rel=1e-4)
    h = s["head_shape"]
    assert row["head_util"] == pytest.approx(np.mean(h["head_util_by_block"]))
    assert h["concentration_by_block"][0] is not None and h["concentration_by_block"][1] is None  # 0 underflows
    assert row["concentration"] == np.inf  # a block whose median key gets no attention: infinitely concentrated
    assert row["diag_mass"] == max(h["diag_mass_by_block"])
    keys = {c.key for c in DiagnosticsSummary.columns()}
    assert set(row) <= keys


def test_the_checkpoint_page_shows_them(report: tuple) -> None:
    path, data, (_, _, _, _, summary) = report
    assert data["depth"] == {k: summary[k] for k in DEPTH_PARTS}
    assert all(data["depth"][k] for k in DEPTH_PARTS)
    page = path.read_text()
    assert 'id="depth-blocks"' in page and "<th>head utilisation</th>" in page and 'href="#depth"' in page
    life = summary["sink_lifetime"]
    assert f"Sink keys per image (a key that is a sink in some block): {num(life['keys_per_image'])}" in page
    assert "Not in this summary" in _depth_html({})
