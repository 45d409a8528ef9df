"""The sink table in the Kempner reference's layout, so that its sinks-per-image numbers can be set beside ours
(docs/fidelity.md): classes from `ratio_head` alone (no stable-rank test), events under the relaxed rule and under
Definition 1 at eps 0.5 / 0.3 / 0.2 / 0.1, counted over the blocks of `scored_blocks` and averaged over images;
columns `total`, `bc`, `nop`, each also on a patch, on [CLS] and on a register.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitsinks.diagnostics.summary import (
    BROADCAST_MIN,
    DEF1_EPS,
    DEFAULT_BLOCK0_POLICY,
    NOP_MAX,
    blocks_label,
    classify,
    events,
    location,
    scored_blocks,
    sinks_per_image,
)
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.tables import markdown_table, write_csv

RATIO = "ratio_head"
# table column prefix -> class name of `sinks_per_image`; column suffix -> location name
CLASS_COLUMNS = {"total": "all", "bc": "broadcast", "nop": "nop"}
PLACE_COLUMNS = {"": "all", "_patch": "patch", "_cls": "cls", "_reg": "register"}
COLUMNS = [f"{c}{p}" for c in CLASS_COLUMNS for p in PLACE_COLUMNS]


def check_eps(eps: Sequence[float]) -> None:
    """Refuse eps outside (0, 0.5]: above 0.5 a head can have several eps-sinks, only one is stored."""
    bad = [e for e in eps if not 0 < e <= 0.5]
    if bad:
        raise BadValue(f"sink table: Definition 1 needs 0 < eps <= 0.5 (above 0.5 a head can have several sinks, "
                       f"but only its dominant column is measured), got eps {', '.join(f'{e:g}' for e in bad)}")


def sink_table(d: dict[str, np.ndarray], eps: Sequence[float] = DEF1_EPS, block0: bool = False,
               protocol: str | None = None, block0_policy: str = DEFAULT_BLOCK0_POLICY) -> dict[str, Any]:
    """Rows of sinks per image (relaxed rule, then Definition 1 at each eps) from `diagnose`'s per-image arrays."""
    check_eps(eps)
    n_blocks = d["sink_idx"].shape[1]
    blocks = scored_blocks(n_blocks, block0, block0_policy)
    cls, loc = classify(d, RATIO, use_rank=False)[:, blocks], location(d)[:, blocks]
    rows = []
    for rule, e in [("relaxed", None), *(("def1", float(x)) for x in eps)]:
        spi = sinks_per_image(events(d, rule, e if e is not None else 0.5)[:, blocks], cls, loc)
        counts = {f"{c}{p}": spi[cname][pname] for c, cname in CLASS_COLUMNS.items()
                  for p, pname in PLACE_COLUMNS.items()}
        rows.append({"rule": rule, "eps": e, **counts})
    return {"images": int(d["sink_idx"].shape[0]), "registers": int(d["num_registers"]), "blocks": n_blocks,
            "blocks_counted": blocks_label(n_blocks, block0, block0_policy), "block0": block0, "protocol": protocol,
            "rows": rows}


def header(table: dict[str, Any]) -> str:
    """The one line that says how the table was counted."""
    return (f"Sinks per image, {table['images']} images, blocks {table['blocks_counted']} of {table['blocks']}; "
            f"classes by {RATIO} alone: broadcast-like (bc) {RATIO} >= {BROADCAST_MIN:g}, NOP-like (nop) {RATIO} <= "
            f"{NOP_MAX:g}, no stable-rank test; rules: relaxed (routed_frac >= 0.9) and Definition 1 "
            f"(min_a >= 1 - eps); {table['registers']} registers"
            + (f"; image protocol {table['protocol']}." if table.get("protocol") else "."))


def _rule_name(row: dict[str, Any]) -> str:
    return "relaxed" if row["rule"] == "relaxed" else f"Def. 1, eps {row['eps']:g}"


def to_markdown(table: dict[str, Any]) -> str:
    """The header line and one row per rule."""
    rows = [[_rule_name(r), *(f"{r[c]:.2f}" for c in COLUMNS)] for r in table["rows"]]
    return "\n".join([header(table), "", *markdown_table(["rule", *COLUMNS], rows)]) + "\n"


def write_sink_table(d: dict[str, np.ndarray], out_dir: Path, eps: Sequence[float] = DEF1_EPS,
                     block0: bool = False, protocol: str | None = None,
                     block0_policy: str = DEFAULT_BLOCK0_POLICY) -> dict[str, Any]:
    """Write `sink_table.md` and `sink_table.csv` (each row carrying its counting settings) into `out_dir`."""
    table = sink_table(d, eps, block0, protocol, block0_policy)
    files.write_text(out_dir / "sink_table.md", to_markdown(table))
    write_csv(out_dir / "sink_table.csv",
              ["rule", "eps", "ratio", "stable_rank_test", "blocks_counted", "n_images", "protocol", *COLUMNS],
              [[r["rule"], "" if r["eps"] is None else f"{r['eps']:g}", RATIO, 0, table["blocks_counted"],
                table["images"], table["protocol"] or "", *(f"{r[c]:.6f}" for c in COLUMNS)] for r in table["rows"]])
    return table
