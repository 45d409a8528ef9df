"""The GPU benchmark's tables (`vitsinks.benchmarks.gpu`): its JSON rendered as Markdown, with the targets checked,
and the rendered block written into a docs page between markers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.tables import markdown_table

START, END = "<!-- gpu-bench:start -->", "<!-- gpu-bench:end -->"
MFU_TARGET = 0.45  # base at ViT-L/16 on an H100 / H200
MFU_SIZE, MFU_DEVICES = "vit_large", r"H100|H200"
ATTN_LIMIT = 1.15  # every attention kind's step time, x base's
GATE_MARGIN = 0.05  # a gate's step time: within its FLOP share + this, x base's
HEADER = ["model", "variant", "mode", "step (ms)", "images/s", "TFLOP/s", "MFU", "peak mem (GiB)", "compile (s)",
          "x base", "target"]


def _reference(rows: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any] | None:
    """The measured `base` row of the same size and mode."""
    return next((r for r in rows if r["exp"] == "base" and r["size"] == row["size"] and r["mode"] == row["mode"]
                 and r["status"] == "ok"), None)


def target(row: dict[str, Any], base: dict[str, Any] | None, device: str | None) -> tuple[str, bool | None]:
    """(this row's target or "", met or not or None): `base` at ViT-L/16 on an H100 / H200: MFU >= 45%; a variant
    differing from `base` only in attention kind: step <= 1.15x base's, only in gate: <= FLOP ratio + 0.05."""
    if row["exp"] == "base":
        if row["size"] != MFU_SIZE or not re.search(MFU_DEVICES, device or ""):
            return "", None
        return f"MFU >= {MFU_TARGET:.0%}", None if row.get("mfu") is None else row["mfu"] >= MFU_TARGET
    if base is None or row.get("status") != "ok":
        return "", None
    differs = {k for k, v in row["arch"].items() if base["arch"].get(k) != v}
    if differs == {"attn"}:
        limit = ATTN_LIMIT
    elif differs == {"gate"}:
        limit = row["flops_per_step"] / base["flops_per_step"] + GATE_MARGIN
    else:
        return "", None
    return f"<= {limit:.3f}x base", row["step_ms"] / base["step_ms"] <= limit


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _row(row: dict[str, Any], rows: list[dict[str, Any]], device: str | None) -> list[str]:
    head = [row["size"], row["exp"], row["mode"]]
    if row["status"] != "ok":
        return [*head, row["status"], *[""] * (len(HEADER) - 4)]
    base = _reference(rows, row)
    ratio = None if base is None or base is row else row["step_ms"] / base["step_ms"]
    text, met = target(row, base, device)
    verdict = text if met is None else f"{text}: {'met' if met else '**missed**'}"
    return [*head, _num(row["step_ms"], ".1f"), _num(row["images_per_s"], ".0f"), _num(row["tflops_per_s"], ".0f"),
            _num(row["mfu"], ".1%"), _num(row["peak_mem_gib"], ".1f"), _num(row.get("compile_s"), ".0f"),
            _num(ratio, ".3f"), verdict]


def render(results: dict[str, Any]) -> str:
    """The Markdown of a benchmark's results (rows not measured say why: unmeasured, skipped, out of memory...)."""
    m = results["meta"]
    rows = [r for r in results["rows"] if r["exp"] != "data"]
    first: dict[str, int] = {}  # table order: size, then variant (as first run), eager before compiled
    for r in rows:
        first.setdefault(r["size"], len(first))
        first.setdefault(r["exp"], len(first))
    rows.sort(key=lambda r: (first[r["size"]], first[r["exp"]], r["mode"] != "eager"))
    if m["status"] == "unmeasured":
        where = "**GPU figures unmeasured**: no run on a GPU yet (the rows below are what a run measures)"
    else:
        peak = m.get("peak_bf16_tflops")
        peak_text = "no bf16 peak known: MFU not computed" if peak is None else f"bf16 dense peak {peak:.1f} TFLOP/s"
        where = f"{m['device']} ({peak_text}), torch {m.get('torch')}, run {m.get('started')} ({m['status']})"
    lines = [f"{where}. Paper recipe (LeJEPA, 4 global views of {m['img_size']} px), {m['batch']} images per step, "
             f"bf16 autocast on CUDA; median of {m['steps']} steps after {m['warmup']} warm-up steps (compile time: "
             f"the first step's excess); MFU from the model FLOPs counted by torch.utils.flop_counter.", ""]
    lines += markdown_table(HEADER, [_row(r, rows, m.get("device")) for r in rows])
    data_row = next((r for r in results["rows"] if r["exp"] == "data"), None)
    if data_row is not None:
        jpegs = m.get("data")
        about = "" if not jpegs else (f" ({jpegs['jpegs']['files']} JPEGs of {jpegs['jpegs']['sizes'][0][0]}x"
                                      f"{jpegs['jpegs']['sizes'][0][1]} px, {jpegs['jpegs']['mean_kb']:.0f} KB on "
                                      f"average, page-cached; {jpegs['cpus']} CPUs)")
        lines += ["", f"Data pipeline, training loader images/s per worker count{about}: {data_row['status']}."]
        if results.get("data"):
            lines += ["", *markdown_table(["workers", "views.backend", "images/s", "views/s"],
                                          [[d["workers"], d.get("backend", ""), _num(d["images_per_s"], ".0f"),
                                            _num(d["views_per_s"], ".0f")] for d in results["data"]])]
    return "\n".join(lines)


def update_docs(path: Path, text: str) -> None:
    """Replace what lies between the `START` and `END` markers of the Markdown file `path` with `text`."""
    doc = path.read_text()
    if doc.count(START) != 1 or doc.count(END) != 1 or doc.index(START) > doc.index(END):
        raise BadValue(f"{path} needs one {START} line and, after it, one {END} line around the GPU table")
    head, rest = doc.split(START)
    files.write_text(path, f"{head}{START}\n{text}\n{END}{rest.split(END, 1)[1]}")
