"""`results/quant.json` (`QuantResult`, written by `python -m vitsinks.quantize`) and its leaderboard columns
(docs/quantization.md), top-1 and mIoU in %; each format has its own columns (`w8a8_cos_err`, `w4a4_cos_err`, ...)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from vitsinks.probes.probe_results import LINEAR_PROBE, ONLINE_PROBE, dense_column, parse_dense_kind
from vitsinks.quant.outliers import stat_max
from vitsinks.utils import files
from vitsinks.utils.results import RESULTS, Column, Result
from vitsinks.utils.rundir import RunDir

Change = dict[str, float]  # {"fp32": x, "quant": y, "delta": y - x}
QUANT = "quantization"  # the leaderboard table of every quantization column
DEFAULT_FORMAT = "W8A8"  # the format whose columns are always there (the others' come with a result of theirs)
# a format's column key: w<weight bits>a<act bits>_<what> (cos_err, d_linear, d_online, d_<dense result kind>)
FORMAT_KEY = re.compile(r"^w(\d+)a(\d+)_(cos_err|d_linear|d_online|d_dense_.+)$")


def quant_format(weight_bits: int, act_bits: int) -> str:
    """The name of a quantization format: `W8A8`, `W4A4`, `W4A8`."""
    return f"W{int(weight_bits)}A{int(act_bits)}"


def format_columns(fmt: str) -> list[Column]:
    """The columns every result of format `fmt` has: 1 - feature cosine, change of linear and online top-1."""
    k, q = fmt.lower(), QUANT
    return [
        Column(f"{k}_cos_err", f"{fmt} 1 - feature cosine", "quality", fmt="g", higher_is_better=False, section=q,
               doc=f"1 - the cosine of the {fmt} model's final tokens to the float model's (mean over tokens and "
                   "images): 0 is lossless; shown with significant digits, a cosine of 0.9999 reads 1e-04"),
        Column(f"{k}_d_linear", f"{fmt} change of linear top-1", "quality", higher_is_better=True, section=q,
               doc=f"linear-probe top-1 of the {fmt} model minus the float model's, in points", probe=LINEAR_PROBE),
        Column(f"{k}_d_online", f"{fmt} change of online top-1", "quality", higher_is_better=True, section=q,
               doc=f"online-probe top-1 on the {fmt} model's features minus on the float model's, in points",
               probe=ONLINE_PROBE),
    ]


def dense_change_column(fmt: str, kind: str) -> Column:
    """The column of format `fmt`'s change of dense result `kind` (one per format, data and dense protocol)."""
    dense = dense_column(*parse_dense_kind(kind))
    return replace(dense, key=f"{fmt.lower()}_d_{kind}", label=f"{fmt} change of {dense.label}", section=QUANT,
                   doc=f"{dense.label} of the {fmt} model minus the float model's, in points")


def change(fp32: float, quant: float) -> Change:
    """A metric of the float model and of the quantised one, and the change."""
    return {"fp32": float(fp32), "quant": float(quant), "delta": float(quant) - float(fp32)}


def _delta(c: Change | None) -> float:
    return math.nan if c is None else c["delta"]


@RESULTS.register
@dataclass
class QuantResult(Result):
    """Outlier statistics per block and layer and the change quantization to `format` makes (`by_block`:
    `{"kurtosis": {layer: [L]}, "inf_norm": {layer: [L]}}`; `online_top1` / `linear_top1`: None where the source run
    has no such probe; `dense`: by dense result kind, one column each)."""

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

    @property
    def format(self) -> str:
        """This result's quantization format (`quant_format`)."""
        return quant_format(self.weight_bits, self.act_bits)

    @classmethod
    def columns(cls) -> list[Column]:
        q = QUANT
        return [
            *format_columns(DEFAULT_FORMAT),
            Column("kurtosis_max", "max kurtosis (linear inputs)", "mechanism", fmt="g", section=q,
                   doc="the largest, over blocks and layers, of a block linear layer's input kurtosis (per image, "
                       "then the mean over images)"),
            Column("inf_norm_max", "max |x| (linear inputs)", "mechanism", fmt="g", section=q,
                   doc="the largest |x| entering a block linear layer, over blocks and layers"),
        ]

    @classmethod
    def extra_columns(cls, keys: set[str]) -> list[Column]:
        """The columns collected beyond `columns()`: W8A8's dense changes, then every other format's own."""
        found: dict[tuple[int, int], list[str]] = {}
        for key in sorted(keys):
            if m := FORMAT_KEY.match(key):
                found.setdefault((int(m[1]), int(m[2])), []).append(m[3])
        cols = [dense_change_column(DEFAULT_FORMAT, what.removeprefix("d_"))
                for what in found.pop((8, 8), []) if what.startswith("d_dense_")]
        for bits, whats in sorted(found.items()):
            fmt = quant_format(*bits)
            cols += format_columns(fmt)
            cols += [dense_change_column(fmt, w.removeprefix("d_")) for w in whats if w.startswith("d_dense_")]
        return cols

    def values(self) -> dict[str, Any]:
        """The leaderboard values of this result, in its format's columns (NaN where a change was not measured)."""
        k = self.format.lower()
        return {f"{k}_cos_err": 1.0 - self.feature_cosine, f"{k}_d_linear": _delta(self.linear_top1),
                f"{k}_d_online": _delta(self.online_top1),
                **{f"{k}_d_{kind}": _delta(c) for kind, c in sorted(self.dense.items())},
                "kurtosis_max": stat_max(self.by_block, "kurtosis"),
                "inf_norm_max": stat_max(self.by_block, "inf_norm")}

    @classmethod
    def read(cls, run: RunDir) -> QuantResult | None:
        """`run`'s result (None: it has none); a torn file is a `BadFile` naming the command that rewrites it."""
        path = run.result(cls.kind)
        if not path.is_file():
            return None
        return cls.from_json(files.read_json(path, f"rerun `python -m vitsinks.quantize ckpt={run.ckpt_dir}/"
                                                   f"<checkpoint>.pt` (last.pt, or the one it quantized)"))

    @classmethod
    def collect(cls, run: RunDir) -> dict[str, Any]:
        res = cls.read(run)
        return cls.missing() if res is None else res.values()

    @classmethod
    def format_of(cls, run: RunDir) -> str | None:
        """The quantization format of `run`'s result (None: it has none): part of what defines its experiment."""
        res = cls.read(run)
        return None if res is None else res.format
