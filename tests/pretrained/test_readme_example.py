"""The notebook example of README.md ("Diagnose a pretrained model") runs as written, and docs/pretrained.md holds the
same code. What it prints is held against the planted head and against the timm model's own forward with that head's
[CLS] value zeroed by a hook (no vitsinks code on that side)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.helpers.adapter_checks import zeroed_value_relrms

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Diagnose a pretrained model"


def example(doc: Path) -> str:
    """The first ```python block after `HEADING` in `doc`."""
    text = doc.read_text()
    assert HEADING in text, f"{doc.name} has no section {HEADING!r}"
    block = re.search(r"^```python\n(.*?)^```$", text[text.index(HEADING) :], re.M | re.S)
    assert block, f"{doc.name}: no python block under {HEADING!r}"
    return block.group(1)


def run(code: str) -> tuple[dict[str, Any], str]:
    """The code's namespace and what it printed."""
    ns: dict[str, Any] = {"__name__": "__readme__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), ns)  # noqa: S102 (the README's own code)
    return ns, out.getvalue()


def zeroed_cls_value_relrms(model: torch.nn.Module, images: torch.Tensor, block: int, head: int) -> np.ndarray:
    """Per image: the relative RMS change of the final patches (timm's `forward_features`) when head `head` of block
    `block` gets a zero value at [CLS], by a hook on its fused qkv Linear (float64 metric)."""
    attn, dim = model.blocks[block].attn, model.embed_dim
    rows = slice(2 * dim + head * attn.head_dim, 2 * dim + (head + 1) * attn.head_dim)
    return zeroed_value_relrms(lambda: model.forward_features(images), attn.qkv, 0, rows,
                               slice(model.num_prefix_tokens, None))


def test_docs_page_holds_the_readme_example() -> None:
    assert example(ROOT / "README.md") == example(ROOT / "docs" / "pretrained.md")


def test_readme_example_runs_as_written() -> None:
    ns, printed = run(example(ROOT / "README.md"))
    assert ns["head"] == (len(ns["model"].blocks) - 1, 0)  # the planted head
    assert "sends 100% of its queries to its cls" in printed
    rows, tables = ns["rows"], ns["tables"]
    assert set(rows["edit"]) == {"zero_sink_value"} and set(rows["sink_loc"]) == {"cls"}
    assert float(tables["checks"]["recompute_error"].max()) < 1e-4
    want = zeroed_cls_value_relrms(ns["model"], ns["images"], *ns["head"])
    np.testing.assert_allclose(rows["final_patch_relrms"], want, rtol=1e-4)
    assert f"{np.mean(want):.1%}" in printed
    assert "about 12%" in (ROOT / "README.md").read_text() and abs(np.mean(want) - 0.12) < 0.005
