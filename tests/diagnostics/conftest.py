"""The diagnostics' shared fixture: one report page of the planted sink, written once per module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.diagnosed import QUANT, RESIDUAL, diagnosed
from vitsinks.backbones import adapt
from vitsinks.diagnostics.page import REPORT_JSON, checkpoint_report


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, tuple]:
    out = tmp_path_factory.mktemp("ckpt") / "final"
    case = diagnosed()
    model, images, shown, d, summary = case
    summary = {**summary, "residual": RESIDUAL}
    path = checkpoint_report(adapt(model), images, shown, d, summary, out, n_images=2, quant=QUANT)
    return path, json.loads((out / REPORT_JSON).read_text()), case
