"""Render an aggregated leaderboard (`collect.aggregate`): Markdown, HTML and CSV, with the Welch-test marks, the
footnotes (marking rule, sink rule) and the reference numbers. The figure is `vitsinks.report.figure`."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from vitsinks.diagnostics.rules import CLASSES, SinkRules
from vitsinks.diagnostics.summary import describe_rule, rule_record
from vitsinks.models.mitigations import mitigation_columns
from vitsinks.report.collect import NOT_COMPARABLE, columns, quality
from vitsinks.utils.columns import SECTIONS, Column
from vitsinks.utils.plotting import swatches_html
from vitsinks.utils.stats import welch_p
from vitsinks.utils.tables import html_table, markdown_table, write_csv


class ReferenceTable(TypedDict):
    """A table of published numbers shown under the leaderboard: its header, its rows and notes."""

    columns: list[str]
    rows: list[list[str]]
    notes: NotRequired[list[str]]


# The Kempner gate x register sweep (ViT-L/16 LeJEPA, 3 seeds; IN-1k is the online probe).
REFERENCE: ReferenceTable = {
    "columns": ["variant", "IN-1k top-1", "ADE20K mIoU", "VOC mIoU"],
    "rows": [["base", "69.37", "16.59", "43.81"], ["reg", "69.31", "18.71", "49.90"],
             ["gate", "69.52", "18.57", "47.95"], ["gate+reg", "69.36", "19.99", "52.17"],
             ["headwise gate", "69.07", "18.51", "47.62"], ["headwise gate+reg", "69.13", "19.92", "52.41"]],
    "notes": ["IN-1k top-1: the online probe (LayerNorm + Linear on the detached final-norm [CLS]). ADE20K / VOC: "
              "the reference's linear probe at 512 x 512 (eval.dense_protocol=kempner), comparable with the "
              "'(reference probe)' columns only, not with the DINOv2-style ones.",
              "LeJEPA paper, frozen linear IN-1k after 100 epochs: ViT-L 77.1, ViT-H/14 79.",
              "DINOv2 linear dense probes: ADE20K 44.3 / 47.3 / 47.7 mIoU, VOC 81.1 / 82.5 / 82.1 (ViT-S/B/L)."],
}
# The Kempner sink table (LeJEPA ViT-L, epoch-50 checkpoints, 1,984 ADE20K val images at 224 px), counted with
# SINK_REFERENCE_RULE: shown only beside sink counts made the same way.
SINK_REFERENCE: ReferenceTable = {
    "columns": ["variant", "broadcast-like", "NOP-like", "all sinks", "on [CLS]"],
    "rows": [["base (Baseline)", "0.09", "0.25", "0.45", "0.34"], ["gate (Gating)", "3.80", "0.00", "3.88", "2.02"],
             ["global+pen (Global + Penalty)", "0.04", "0.00", "0.11", "0.11"],
             ["gate+global+pen (Gating + Global + Penalty)", "0.53", "0.03", "0.63", "0.08"]],
}
REFERENCE_BLOCKS = 12  # any model with more than one block: the reference counts blocks 1..L-1
SINK_REFERENCE_RULE = describe_rule(rule_record(SinkRules(ratio="ratio_head", use_stable_rank=False),
                                                REFERENCE_BLOCKS))
ALPHA, MIN_SEEDS = 0.05, 3  # Welch's test level and the fewest seeds per variant it is run with
SINK_REFERENCE_TITLE = (f"Reference sinks per image (Kempner, LeJEPA ViT-L, epoch 50, 1,984 ADE20K val images; "
                        f"{SINK_REFERENCE_RULE})")
DEFINITIONS = ("Strongest head: the (block, head) with the largest mean sink mass, where its dominant key sits most "
               "often, its mass on the prefix tokens and its value ratio. Share mass >= 0.3: of all (image, block, "
               "head) triples. Attn. common-mode share: the common-mode penalty of the attention update (energy of "
               "the token-mean update over the update's energy), mean over blocks.")
CAUSAL_NOTE = ("Causal columns (`python -m vitsinks.intervene`): final patch tokens' relative RMS change when one "
               "head's sink value is zeroed (or its sink attention redirected), mean over the head's events of that "
               "class, then over heads; drop registers: the whole model run without them.")


def table_columns(table: list[dict[str, Any]]) -> list[Column]:
    """The columns of an aggregated table (every registered one, and those its rows add)."""
    return columns(set(table[0]) if table else ())


def _style(col: Column) -> str:
    """`g` (significant digits) or `f` (fixed decimals), from the column's number style."""
    return "g" if col.fmt.endswith("g") else "f"


def cell(mean_std: tuple[float, float], col: Column | None = None, digits: int = 2) -> str:
    """`mean ± std` with `digits` decimals, or significant digits for a `g` column; `-` for NaN."""
    m, s = mean_std
    if math.isnan(m):
        return "-"
    fmt = f"{{:.{digits}{_style(col) if col else 'f'}}}"
    return fmt.format(m) if math.isnan(s) else f"{fmt.format(m)} ± {fmt.format(s)}"


def shown(t: dict[str, Any], col: Column) -> str:
    """Row `t`'s cell in `col`: `cell`, or NOT_COMPARABLE."""
    return NOT_COMPARABLE if col.key in t.get("not_comparable", {}) else cell(t[col.key], col)


def comparable_note(table: list[dict[str, Any]]) -> str:
    """The rule for derived rows, and why each cell shown as not comparable is (empty when none is)."""
    cells = [f"{t['variant']}, {c.label}: {'; '.join(t['not_comparable'][c.key])}" for t in table
             for c in table_columns(table) if c.key in t.get("not_comparable", {})]
    if not cells:
        return ""
    return (f"{NOT_COMPARABLE.capitalize()}: a derived row (a post-hoc edit) shows a probe's value only where each of "
            f"its runs' source runs is in the leaderboard with the same probe (the same column), the same probe seed "
            f"and the checkpoint the edit was made from. " + ". ".join(cells) + ".")


ROWS_NOTE = ("A row is one experiment: the runs of a variant are averaged only when everything but the seed matches "
             "(config.yaml beyond bookkeeping, the steps trained, the checkpoint an edit was made from, the "
             "quantization format, the sink rule); runs that differ are separate rows, named by what differs.")


def rows_note(table: list[dict[str, Any]]) -> str:
    """The grouping rule, when some variant's runs were split into several rows (empty when none was)."""
    return ROWS_NOTE if any(t.get("differs") for t in table) else ""


def _beats(a: dict[str, Any], b: dict[str, Any], col: Column) -> bool:
    """`a` is better than `b` in `col`: a mean on the better side, not equal as shown, and Welch's p < ALPHA."""
    key = col.key
    (ma, sa), (mb, sb) = a[key], b[key]
    worse = ma <= mb if col.higher_is_better else ma >= mb
    if col.higher_is_better is None or worse or cell((ma, math.nan), col) == cell((mb, math.nan), col):
        return False
    return welch_p(ma, sa, a["n"][key], mb, sb, b["n"][key]) < ALPHA


def significant_best(table: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """Per quality column, the variant better than every other by Welch's test; and the columns with too few seeds."""
    best: dict[str, str] = {}
    few: list[str] = []
    for col in quality(table_columns(table)):
        rows = [t for t in table if not math.isnan(t[col.key][0])]
        if len(rows) < 2:
            continue
        if min(t["n"][col.key] for t in rows) < MIN_SEEDS:
            few.append(col.label)
            continue
        best.update((col.key, t["variant"]) for t in rows if all(_beats(t, o, col) for o in rows if o is not t))
    return best, few


def mark_note(few: list[str], mark: str = "Bold") -> str:
    """The marking rule in words, and the columns it could not be applied to."""
    note = (f"{mark}: a variant better than every other variant of its quality column by a two-sided Welch t-test "
            f"(unequal variances), p < {ALPHA:g} in each comparison, with >= {MIN_SEEDS} seeds per variant; means "
            f"equal as shown are never marked.")
    if few:
        note += (f" Nothing is marked in {', '.join(few)}: some variant has fewer than {MIN_SEEDS} seeds there, too "
                 f"few for the test.")
    return note


def _rules(table: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each sink rule the runs' summaries counted with -> the variants that used it."""
    out: dict[str, list[str]] = {}
    for t in table:
        for r in t["sink_rules"]:
            out.setdefault(r, []).append(t["variant"])
    return out


def rule_notes(table: list[dict[str, Any]]) -> list[str]:
    """Which rule the sink columns used, and whether the reference's sinks per image can sit beside them."""
    rules = _rules(table)
    if not rules:
        return ["No diagnostics summaries: no sink counts, and no reference sinks per image."]
    if len(rules) == 1:
        notes = [f"Sink columns counted with: {next(iter(rules))}. Def.1: min_a >= 1 - eps, same blocks."]
    else:
        notes = ["The runs' summaries counted sinks with different rules: "
                 + "; ".join(f"{r} ({', '.join(v)})" for r, v in rules.items()) + "."]
    if not reference_comparable(table):
        notes.append(f"The reference's sinks per image are left out: the reference counts them with "
                     f"[{SINK_REFERENCE_RULE}], these runs' summaries do not (or do not say), so the numbers would "
                     f"not be comparable; each diagnosed checkpoint's sink_table.md counts the reference's way.")
    return notes


def reference_comparable(table: list[dict[str, Any]]) -> bool:
    return list(_rules(table)) == [SINK_REFERENCE_RULE]


def shown_columns(table: list[dict[str, Any]]) -> list[Column]:
    """Only the columns some variant has a value for (or a value shown as not comparable)."""
    return [c for c in table_columns(table)
            if any(not math.isnan(t[c.key][0]) or c.key in t.get("not_comparable", {}) for t in table)]


def definitions(table: list[dict[str, Any]]) -> str:
    """`DEFINITIONS`, then the docs line of every shown mitigation or sink column that carries one."""
    own = {c.key for c in mitigation_columns()}
    return " ".join([DEFINITIONS, *(f"{c.label[:1].upper()}{c.label[1:]}: {c.doc}." for c in shown_columns(table)
                                    if c.doc and (c.key in own or c.section == "sinks"))])


def sections(table: list[dict[str, Any]]) -> list[tuple[str, str, list[Column]]]:
    """The leaderboard's tables (SECTIONS order, empty ones left out): key, title and the shown columns of each."""
    cols = shown_columns(table)
    return [(key, title, [c for c in cols if c.table == key]) for key, title in SECTIONS.items()
            if any(c.table == key for c in cols)]


def _head(key: str) -> list[str]:
    return ["variant", "seeds", *(["strongest sink at"] if key == "sinks" else [])]


def _lead(t: dict[str, Any], key: str) -> list[str]:
    return [t["variant"], str(t["seeds"]), *([t["sink_at"]] if key == "sinks" else [])]


def to_markdown(table: list[dict[str, Any]], unfinished: Sequence[str] = ()) -> str:
    """The leaderboard's tables, footnotes (one line per `unfinished` run) and reference blocks."""
    best, few = significant_best(table)
    lines = []
    for key, title, cols in sections(table):
        rows = [[*_lead(t, key), *(f"**{shown(t, c)}**" if best.get(c.key) == t["variant"]
                                   else shown(t, c) for c in cols)] for t in table]
        lines += [f"## {title}", "", *markdown_table([*_head(key), *(c.label for c in cols)], rows), ""]
    lines += [f"Mean ± std over seeds. {mark_note(few)}", ""]
    lines += [line for note in (rows_note(table), comparable_note(table), *unfinished) if note for line in (note, "")]
    lines += [" ".join(rule_notes(table)), "", definitions(table)]
    if any(not math.isnan(t[c.key][0]) for t in table for c in table_columns(table) if c.group == "causal"):
        lines += ["", CAUSAL_NOTE]
    lines += ["", "## Reference numbers", "", "Papers, ViT-L, not comparable in scale with CPU runs:", "",
              *markdown_table(REFERENCE["columns"], REFERENCE["rows"]), "", *(f"- {n}" for n in REFERENCE["notes"])]
    if reference_comparable(table):
        lines += ["", f"{SINK_REFERENCE_TITLE}:", "", *markdown_table(SINK_REFERENCE["columns"],
                                                                      SINK_REFERENCE["rows"])]
    return "\n".join(lines) + "\n"


def to_html(table: list[dict[str, Any]], title: str, unfinished: Sequence[str] = ()) -> str:
    """The leaderboard as one HTML page: the same tables, footnotes and reference blocks as the Markdown."""
    best, few = significant_best(table)
    esc = html.escape
    main = "\n".join(f'<h2>{esc(name)}</h2><div class="wide">' + html_table(
        [*_head(key), *(c.label for c in cols)],
        [[*_lead(t, key), *((shown(t, c), "best" if best.get(c.key) == t["variant"] else "") for c in cols)]
         for t in table], f"leaderboard-{key}", sep="\n") + "</div>" for key, name, cols in sections(table))
    foot = "".join(f"<p>{esc(n)}</p>" for n in [f"Mean ± std over seeds. {mark_note(few, 'Highlighted')}",
                                                 rows_note(table), comparable_note(table), *unfinished,
                                                 " ".join(rule_notes(table)),
                                                 definitions(table)] if n)
    foot += f"<p>The sink classes in the figure: {swatches_html(CLASSES)}</p>"
    notes = "".join(f"<li>{esc(n)}</li>" for n in REFERENCE["notes"])
    sinks = (f"<h2>{esc(SINK_REFERENCE_TITLE)}</h2>"
             f"{html_table(SINK_REFERENCE['columns'], SINK_REFERENCE['rows'], 'reference-sinks')}"
             if reference_comparable(table) else "")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;margin-bottom:1.5em}}
td,th{{border:1px solid #bbb;padding:4px 8px;text-align:right}} td{{white-space:nowrap}}
td:first-child,th:first-child{{text-align:left}}
th{{background:#eee}} div.wide{{overflow-x:auto}} td.best{{font-weight:bold;background:#e6f4e6}}</style></head>
<body><h1>{esc(title)}</h1>
{main}
{foot}
<h2>Reference numbers (papers, ViT-L)</h2>
{html_table(REFERENCE["columns"], REFERENCE["rows"], "reference")}<ul>{notes}</ul>
{sinks}
<img src="leaderboard.png" alt="quality and sinks per variant" style="max-width:100%"></body></html>
"""


def write_table_csv(table: list[dict[str, Any]], path: Path) -> None:
    """leaderboard.csv: per variant the mean and std of every shown column and the strongest head's mass per
    block (a column no run has a value for left out)."""
    cols = shown_columns(table)

    def values(t: dict[str, Any], c: Column) -> list[str]:
        off = c.key in t.get("not_comparable", {})
        return [NOT_COMPARABLE if off else f"{v:.4{_style(c)}}" for v in t[c.key]]

    write_csv(path, ["variant", "seeds", "sink_at", *(f"{c.key}_{s}" for c in cols for s in ("mean", "std")),
                     "strongest_mass_by_block"],
              [[t["variant"], t["seeds"], t["sink_at"], *(v for c in cols for v in values(t, c)),
                " ".join(f"{v:.4f}" for v in t["profile"])] for t in table])


def _no_value(v: Any) -> bool:
    """A collected cell without a value: absent (None) or NaN."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def write_runs_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """runs.csv: one row per run as collected, without `_*` fields or columns no run has a value for."""
    keys = list(dict.fromkeys(k for r in rows for k in r if not k.startswith("_")))
    empty = {c.key for c in columns(keys) if all(_no_value(r.get(c.key)) for r in rows)}
    header = [k for k in keys if k not in empty]
    write_csv(path, header, [{**{k: r.get(k, math.nan) for k in header},
                              "profile": " ".join(f"{v:.4f}" for v in r["profile"])} for r in rows])
