"""`results/quant.json` (`QuantResult`, written by `python -m vitsinks.quantize`) and its leaderboard columns
(docs/quantization.md). Top-1 and mIoU values are in %."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from vitsinks.eval.results import LINEAR_PROBE, ONLINE_PROBE, dense_column, parse_dense_kind
from vitsinks.quant.stats import stat_max
from vitsinks.utils.results import Column, Result, register_result
from vitsinks.utils.rundir import RunDir

Change = dict[str, float]  # {"fp32": x, "quant": y, "delta": y - x}
QUANT = "quantization"  # the leaderboard table of every W8A8 column
DENSE_CHANGE = "w8a8_d_"  # + a dense result kind: the column of that dense probe's change (one per data and protocol)


def change(fp32: float, quant: float) -> Change:
    """A metric of the float model and of the quantised one, and the change."""
    return {"fp32": float(fp32), "quant": float(quant), "delta": float(quant) - float(fp32)}


def _delta(c: Change | None) -> float:
    return math.nan if c is None else c["delta"]


@register_result
@dataclass
class QuantResult(Result):
    """Outlier statistics per block and layer and the change W8A8 makes (`by_block`: `{"kurtosis": {layer: [L]},
    "inf_norm": {layer: [L]}}`; `online_top1` / `linear_top1`: None where the source run has no such probe;
    `dense`: by dense result kind, one column each)."""

    kind = "quant"
    rank = 60

    checkpoint: str
    weight_bits: int
    act_bits: int
    calib_images: int
    n_images: int
    by_block: dict[str, dict[str, list[float | None]]]
    feature_cosine: float
    feature_cosine_by_block: list[float]
    online_top1: Change | None = None
    linear_top1: Change | None = None
    dense: dict[str, Change] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> QuantResult:
        return cls(**{f.name: obj[f.name] for f in fields(cls) if f.name in obj})

    @classmethod
    def columns(cls) -> list[Column]:
        q = QUANT
        return [
            Column("w8a8_cos_err", "W8A8 1 - feature cosine", "quality", fmt="g", higher_is_better=False, section=q,
                   doc="1 - the cosine of the W8A8 model's final tokens to the float model's (mean over tokens and "
                       "images): 0 is lossless; shown with significant digits, a cosine of 0.9999 reads 1e-04"),
            Column("w8a8_d_linear", "W8A8 change of linear top-1", "quality", higher_is_better=True, section=q,
                   doc="linear-probe top-1 of the W8A8 model minus the float model's, in points", probe=LINEAR_PROBE),
            Column("w8a8_d_online", "W8A8 change of online top-1", "quality", higher_is_better=True, section=q,
                   doc="online-probe top-1 on the W8A8 model's features minus on the float model's, in points",
                   probe=ONLINE_PROBE),
            Column("kurtosis_max", "max kurtosis (linear inputs)", "mechanism", fmt="g", section=q,
                   doc="the largest, over blocks and layers, of a block linear layer's input kurtosis (per image, "
                       "then the mean over images)"),
            Column("inf_norm_max", "max |x| (linear inputs)", "mechanism", fmt="g", section=q,
                   doc="the largest |x| entering a block linear layer, over blocks and layers"),
        ]

    @classmethod
    def extra_columns(cls, keys: set[str]) -> list[Column]:
        """One column per dense result kind whose W8A8 change was collected (`w8a8_d_<kind>`, in sorted order):
        the changes of two dense protocols or datasets never share a column."""
        cols = []
        for key in sorted(k for k in keys if k.startswith(f"{DENSE_CHANGE}dense_")):
            dense = dense_column(*parse_dense_kind(key.removeprefix(DENSE_CHANGE)))
            cols.append(replace(dense, key=key, label=f"W8A8 change of {dense.label}", section=QUANT,
                                doc=f"{dense.label} of the W8A8 model minus the float model's, in points"))
        return cols

    def values(self) -> dict[str, Any]:
        """The leaderboard values of this result (NaN where a change was not measured)."""
        return {"w8a8_cos_err": 1.0 - self.feature_cosine, "w8a8_d_linear": _delta(self.linear_top1),
                "w8a8_d_online": _delta(self.online_top1),
                **{f"{DENSE_CHANGE}{kind}": _delta(c) for kind, c in sorted(self.dense.items())},
                "kurtosis_max": stat_max(self.by_block, "kurtosis"),
                "inf_norm_max": stat_max(self.by_block, "inf_norm")}

    @classmethod
    def collect(cls, run: RunDir) -> dict[str, Any]:
        path = run.result(cls.kind)
        return cls.from_json(json.loads(path.read_text())).values() if path.is_file() else cls.missing()
