"""The notebook API around the views: `report` writes what the CLI's diagnosis writes, by the same code; the head
table's events and classes follow the sink rules; images come as a tensor, a dataset or a DataLoader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.timm_models import CONFIGS, images, own_twin, timm_vit
from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics import run_diagnostics, stretched
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.pretrained import diagnose, diagnose_fields, report
from vitsinks.pretrained.images import as_images
from vitsinks.utils.errors import BadValue


def _close(a: object, b: object, path: str = "") -> None:
    """Two JSON values equal, numbers to 1e-4 relative."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            _close(u, v, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float | int):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5, nan_ok=True), path
    else:
        assert a == b, path


@torch.no_grad()
def test_report_writes_what_the_cli_writes_for_the_converted_model(tmp_path: Path) -> None:
    cfg = CONFIGS["dinov2_reg"]
    m = timm_vit(cfg)
    own, x = own_twin(m, cfg), images(4)
    shown = stretched(x)
    settings = DiagnosticsConfig(report_images=2)
    got = report(m, x, tmp_path / "timm", settings=settings, batch_size=3)
    want = run_diagnostics(own, x, shown, tmp_path / "own", settings)  # what `python -m vitsinks.diagnose` runs
    ours, theirs = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("timm", "own"))
    _close(ours, theirs)
    _close(got, want)
    a, b = np.load(tmp_path / "timm" / "per_image.npz"), np.load(tmp_path / "own" / "per_image.npz")
    assert set(a.files) == set(b.files)
    np.testing.assert_array_equal(a["sink_idx"], b["sink_idx"])
    for k in ("mass", "routed_frac", "ratio_out", "res_norm", "massive_ratio"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert (tmp_path / "timm" / "sink_table.md").read_text() == (tmp_path / "own" / "sink_table.md").read_text()
    for name in ("report.html", "attention_maps.png", "nop_broadcast_scatter.png", "residual_norms.png"):
        assert (tmp_path / "timm" / name).stat().st_size > 1000, name
    page = json.loads((tmp_path / "timm" / "report.json").read_text())
    assert page["model"]["registers"] == cfg["reg_tokens"] and page["model"]["images_shown"] == 2


@torch.no_grad()
def test_head_table_events_and_classes_follow_the_rules() -> None:
    m, x = timm_vit(CONFIGS["deit"]), images(3)
    d = diagnose_fields(m, x)
    for rules in (SinkRules(), SinkRules(rule="def1", eps=0.3, ratio="ratio_head", use_stable_rank=False)):
        t = diagnose(m, x, rules=rules)["heads"]
        # the rules written out by hand (docs/sinks.md): an event routes >= 90% (relaxed) or has min_a >= 1 - eps
        # (def1); NOP ratio <= 0.2, broadcast ratio >= 0.5 (and stable rank <= 1.5 when it is used)
        event = t["routed_frac"] >= 0.9 if rules.rule == "relaxed" else t["min_a"] >= 1 - rules.eps
        r = t[rules.ratio]
        broad = (r >= 0.5) & ((t["stable_rank"] <= 1.5) if rules.use_stable_rank else True)
        want = np.where(~event, "none", np.where(r <= 0.2, "nop", np.where(broad, "broadcast", "other")))
        np.testing.assert_array_equal(t["event"], event)
        np.testing.assert_array_equal(t["sink_class"], want)
        assert len(t["event"]) == d["sink_idx"].size


@torch.no_grad()
def test_images_from_a_dataset_or_a_loader_equal_the_tensor() -> None:
    m, x = timm_vit(CONFIGS["deit"]), images(5)
    want = diagnose_fields(m, x[:4])
    labelled = TensorDataset(x, torch.arange(5))
    for source in (labelled, DataLoader(labelled, batch_size=3), [{"pixel_values": x[:2]}, {"pixel_values": x[2:]}]):
        got = diagnose_fields(m, source, n_images=4)
        np.testing.assert_array_equal(got["sink_idx"], want["sink_idx"])
        np.testing.assert_allclose(got["mass"], want["mass"], rtol=1e-6)
    assert as_images(x, 2).shape == (2, 3, 32, 32)
    with pytest.raises(BadValue, match="not an image tensor"):
        as_images(["a.jpg", "b.jpg"])
    with pytest.raises(BadValue, match="n_images"):
        as_images(x, 0)
