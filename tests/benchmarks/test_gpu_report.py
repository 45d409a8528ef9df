"""The GPU benchmark's table: targets checked against the issue's rules, unmeasured rows, the docs block."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitsinks.benchmarks.gpu_report import END, START, render, target, update_docs
from vitsinks.utils.errors import BadValue

BASE_ARCH = {"attn": "softmax", "gate": "none", "registers": 0, "pathway": False, "cm_penalty": 0.0}


def row(exp: str, step_ms: float, flops: float = 100e12, mode: str = "eager", size: str = "vit_large",
        **arch: object) -> dict:
    return {"size": size, "exp": exp, "mode": mode, "status": "ok", "arch": {**BASE_ARCH, **arch},
            "step_ms": step_ms, "images_per_s": 64 / step_ms * 1e3, "flops_per_step": flops,
            "tflops_per_s": flops / step_ms / 1e9, "mfu": flops / (step_ms / 1e3) / 989.5e12, "peak_mem_gib": 40.0,
            "compile_s": 50.0 if mode == "compiled" else None}


def results(rows: list[dict], device: str = "NVIDIA H200") -> dict:
    meta = {"device": device, "peak_bf16_tflops": 989.5, "torch": "2.11", "started": "today", "status": "finished",
            "img_size": 224, "batch": 64, "steps": 5, "warmup": 3,
            "data": {"jpegs": {"files": 1024, "sizes": [[500, 375]], "mean_kb": 101.0}, "cpus": 16}}
    data = [{"workers": 0, "backend": "device", "images_per_s": 50.0, "views_per_s": 200.0},
            {"workers": 8, "backend": "device", "images_per_s": 380.0, "views_per_s": 1520.0}]
    return {"meta": meta, "rows": rows, "data": data}


def cells(text: str, exp: str, mode: str = "eager") -> list[str]:
    """The cells of the table line of `exp` in `mode`."""
    for line in text.splitlines():
        parts = [c.strip() for c in line.strip("|").split("|")]
        if len(parts) > 3 and parts[1] == exp and parts[2] == mode:
            return parts
    raise AssertionError(f"no row {exp} {mode} in\n{text}")


def test_targets_follow_the_issue_rules() -> None:
    base = row("base", 200.0, flops=100e12)  # 100 TFLOPs in 0.2 s on 989.5: 50.5% MFU
    assert target(base, base, "NVIDIA H200") == ("MFU >= 45%", True)
    assert target(row("base", 300.0), None, "NVIDIA H100 80GB HBM3") == ("MFU >= 45%", False)  # 33.7%
    assert target(base, base, "NVIDIA A100-SXM4-80GB") == ("", None)  # the MFU target is for H100 / H200
    assert target(row("base", 200.0, size="vit_base"), None, "NVIDIA H200") == ("", None)  # and for ViT-L
    # a gate with 8% more FLOPs: its limit is 1.08 + 0.05 of base's time
    gate = row("gate", 225.0, flops=108e12, gate="elementwise")
    assert target(gate, base, "NVIDIA H200") == ("<= 1.130x base", True)
    assert target(row("gate", 227.0, flops=108e12, gate="elementwise"), base, "")[1] is False
    # an attention kind: 1.15x base's time
    assert target(row("softpick", 229.0, attn="softpick"), base, "") == ("<= 1.150x base", True)
    assert target(row("relu", 231.0, attn="relu"), base, "") == ("<= 1.150x base", False)
    # registers, or a gate with registers: no target
    assert target(row("reg", 300.0, registers=4), base, "") == ("", None)
    assert target(row("gate+reg", 300.0, gate="elementwise", registers=4), base, "") == ("", None)


def test_the_table_renders_every_row_with_its_ratio_and_verdict() -> None:
    rows = [row("base", 200.0), row("base", 150.0, mode="compiled"), row("softpick", 240.0, attn="softpick"),
            row("softpick", 165.0, mode="compiled", attn="softpick"),
            {"size": "vit_large", "exp": "gate", "mode": "eager", "status": "skipped (budget)"},
            {"size": "vit_large", "exp": "data", "mode": "eager", "status": "ok"}]
    text = render(results(rows))
    assert "NVIDIA H200" in text and "1024 JPEGs of 500x375 px" in text
    base = cells(text, "base")
    assert base[3:9] == ["200.0", "320", "500", "50.5%", "40.0", ""] and base[10] == "MFU >= 45%: met"
    assert cells(text, "base", "compiled")[8] == "50"  # compile seconds
    soft = cells(text, "softpick")
    assert soft[9] == "1.200" and soft[10] == "<= 1.150x base: **missed**"  # against base in the same mode
    soft_c = cells(text, "softpick", "compiled")
    assert soft_c[9] == "1.100" and soft_c[10] == "<= 1.150x base: met"
    assert cells(text, "gate")[3] == "skipped (budget)"
    assert "| 8 | device | 380 | 1520 |" in text  # the data table
    with pytest.raises(AssertionError):
        cells(text, "data")  # the data task is no model row


def test_an_unmeasured_run_says_so() -> None:
    res = results([{"size": "vit_large", "exp": "base", "mode": "eager", "status": "unmeasured"}])
    res["meta"]["status"] = "unmeasured"
    text = render(res)
    assert "GPU figures unmeasured" in text and cells(text, "base")[3] == "unmeasured"


def test_the_docs_block_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text(f"# Title\n\nbefore\n{START}\nold table\n{END}\nafter\n")
    update_docs(doc, "new table")
    assert doc.read_text() == f"# Title\n\nbefore\n{START}\nnew table\n{END}\nafter\n"
    update_docs(doc, "newer")  # again: idempotent layout
    assert doc.read_text() == f"# Title\n\nbefore\n{START}\nnewer\n{END}\nafter\n"
    bad = tmp_path / "bad.md"
    bad.write_text("no markers\n")
    with pytest.raises(BadValue, match="gpu-bench:start"):
        update_docs(bad, "x")
    assert bad.read_text() == "no markers\n"
