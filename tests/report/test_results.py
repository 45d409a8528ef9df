"""Typed results: every registered type reads back exactly what its producer writes (and what older versions
wrote), and the interventions report's scopes are structured fields."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers.tiny import tiny_vit
from vitsinks.diagnostics import diagnose, summarize
from vitsinks.interventions.report import InterventionsReport, scope_of
from vitsinks.probes.probe_results import probe_seed
from vitsinks.report import collect  # noqa: F401 - registers every result type the leaderboard shows
from vitsinks.utils.results import result_types


def _diagnostics() -> dict[str, Any]:
    torch.manual_seed(0)
    return {**summarize(diagnose(tiny_vit(gate="elementwise"), torch.randn(3, 3, 32, 32))), "protocol": "default"}


_DENSE = {"checkpoint": "c.pt", "data": "fashion_mnist", "classes": 11, "protocol": "kempner",
          "protocol_settings": {"size": 32}, "overrides": {}, "mIoU": 0.4, "seed": 0, "mIoU_std": 0.0, "pixel_acc": 0.9,
          "per_class_iou": [0.5, None], "probes": [{"seed": 0}], "train_images": 8, "val_images": 4, "epochs": 1,
          "augment": True}
_INTERVENTIONS = {"subject": "run/last (vit)", "n_images": 4, "n_blocks": 2, "checks": {"recompute_tol": 1e-4},
                  "by_class": {scope_of(0, 2): {"nop": {"zero_sink_value": {"final_patch_relrms": 9.0}}},
                               scope_of(1, 2): {"nop": {"zero_sink_value": {"final_patch_relrms": 0.25}}},
                               scope_of(-1, 2): {"model": {"drop_registers": {"final_patch_relrms": 0.5}}}}}
# per kind: what today's producer writes, then what an older version wrote (fewer keys)
SAMPLES: dict[str, list[dict[str, Any]]] = {
    "diagnostics": [_diagnostics(), {"sinks_per_image": {}, "massive_activations": {"ratio_by_block": [1.0]}}],
    "interventions": [_INTERVENTIONS, {"by_class": {}}],
    "linear": [{"checkpoint": "c.pt", "data": "synthetic", "classes": 4, "train_images": 8, "val_images": 4,
                "seed": 0, "best": {"lr": 0.1, "top1": 50.0}, "grid": [{"lr": 0.1, "top1": 50.0}]},
               {"best": {"top1": 60.0}}],
    "knn": [{"checkpoint": "c.pt", "data": "synthetic", "protocol": "dino", "feature": "cls", "temperature": 0.07,
             "classes": 4, "train_images": 32, "val_images": 8, "seed": 0, "k": 20, "top1": 50.0,
             "by_k": [{"k": 20, "top1": 50.0, "top4": 100.0}, {"k": 100, "neighbours": 32, "top1": 37.5,
                                                                "top4": 100.0}]}],
    "dense": [_DENSE, {"mIoU": 0.2}],
    "online_probe": [{"val/probe_acc": 0.5}],
    "task_fit": [{"val/rel_error": 0.1}],
    "knn_monitor": [{"val/knn_top1": 0.9}],
    "rankme_monitor": [{"val/rankme": 11.2}],
    "quant": [{"checkpoint": "c.pt", "weight_bits": 8, "act_bits": 8, "calib_images": 4, "n_images": 4,
               "by_block": {"kurtosis": {"qkv": [3.0, 5.0]}, "inf_norm": {"qkv": [2.0, 9.0]}}, "feature_cosine": 0.99,
               "feature_cosine_by_block": [1.0, 0.99], "online_top1": {"fp32": 50.0, "quant": 49.0, "delta": -1.0},
               "linear_top1": None, "dense": {}}],
}


@pytest.mark.parametrize("kind", [t.kind for t in result_types()])
def test_every_result_type_reads_back_what_its_producer_writes(kind: str) -> None:
    cls = next(t for t in result_types() if t.kind == kind)
    assert kind in SAMPLES, f"result type {kind} has no sample here: add what its producer writes"
    for obj in SAMPLES[kind]:
        back = cls.from_json(obj).to_json()
        assert back == obj and list(back) == list(obj)  # same content, same key order: old runs still load
    assert cls.columns() and len({c.key for c in cls.columns()}) == len(cls.columns())


def test_every_column_key_is_unique_across_the_registry() -> None:
    keys = [c.key for t in result_types() for c in t.columns()]
    assert len(keys) == len(set(keys))


def test_interventions_scopes_are_structured() -> None:
    report = InterventionsReport.from_json(_INTERVENTIONS)
    assert [s.kind for s in report.scopes] == ["block0", "main", "model"]
    assert report.classes("main")["nop"]["zero_sink_value"]["final_patch_relrms"] == 0.25
    assert report.classes("block0")["nop"]["zero_sink_value"]["final_patch_relrms"] == 9.0
    assert report.classes("model")["model"]["drop_registers"]["final_patch_relrms"] == 0.5
    one_block = InterventionsReport.from_json({"by_class": {scope_of(0, 1): {"nop": {}}}})
    assert [s.kind for s in one_block.scopes] == ["main"]  # a one-block model's only block is its main scope


def test_the_probe_seed_is_the_recorded_one_else_the_first_dense_heads() -> None:
    assert probe_seed({"seed": 3, "probes": [{"seed": 5}]}) == 3
    assert probe_seed({"mIoU": 0.2, "probes": [{"seed": 5}, {"seed": 6}]}) == 5  # written before `seed` was on top
    assert probe_seed({"best": {"top1": 60.0}}) is None  # an older linear result: unknown, not 0
