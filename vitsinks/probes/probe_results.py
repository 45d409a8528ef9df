"""The probes' typed results: `results/linear[_<protocol>].json` (`LinearResult`), `results/knn[_<protocol>].json`
(`KnnResult`) and `results/dense_<data>[_<protocol>][_mmseg].json` (`DenseResult`), with their leaderboard columns
(one per protocol and dense backend). The JSON on disk is what the probes wrote before these types."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitsinks.data.datasets import DATASETS, with_masks
from vitsinks.probes.dense_protocols import DEFAULT_PROTOCOL, DENSE_PROTOCOLS
from vitsinks.probes.knn_protocols import DEFAULT_KNN, KNN_PROTOCOLS, knn_kind
from vitsinks.probes.linear_protocols import DEFAULT_LINEAR, LINEAR_PROTOCOLS, linear_kind
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.results import RESULTS, Column, Probed, Result
from vitsinks.utils.rundir import RunDir

# The probes' protocols as their columns name them (`Column.probe`); the online probe's column is the training's
ONLINE_PROBE, LINEAR_PROBE = "online probe", LINEAR_PROTOCOLS[DEFAULT_LINEAR].label
NATIVE, MMSEG = "native", "mmseg"  # the dense probe's backends (`eval.dense_backend`); a kind names mmseg's


def reprobe(run: RunDir, kind: str) -> str:
    """The fix for a torn probe result `kind` (`linear[_<protocol>]`, `knn[_<protocol>]`, `dense_<data>[_<protocol>]`)
    of `run`: the command that writes it again."""
    ckpt = f"ckpt={run.ckpt_dir}/<checkpoint>.pt"
    if kind.startswith("knn"):
        protocol = "" if kind == "knn" else f" eval.knn_protocol={kind.removeprefix('knn_')}"
        return f"rerun `python -m vitsinks.eval.linear {ckpt}{protocol}`"
    if kind.startswith("linear"):
        protocol = "" if kind == "linear" else f" eval.linear_protocol={kind.removeprefix('linear_')}"
        return f"rerun `python -m vitsinks.eval.linear {ckpt}{protocol}`"
    data, proto, backend = parse_dense_kind(kind)
    protocol = "" if proto == DEFAULT_PROTOCOL else f" eval.dense_protocol={proto}"
    protocol += "" if backend == NATIVE else f" eval.dense_backend={backend}"
    return f"rerun `python -m vitsinks.eval.dense {ckpt} data={data}{protocol}`"


def read_result(run: RunDir, kind: str) -> dict[str, Any]:
    """`run`'s probe result `kind` as its JSON object; a torn file is a `BadFile` naming it and `reprobe`'s fix."""
    return files.read_json(run.result(kind), reprobe(run, kind))


def dense_probe(protocol: str, backend: str = NATIVE) -> str:
    """The `Column.probe` of a dense probe's columns: one per protocol (`DENSE_PROTOCOLS`) and backend."""
    return f"dense probe ({protocol})" if backend == NATIVE else f"dense probe ({protocol}, {backend})"


def linear_column(protocol: str) -> Column:
    """The leaderboard column of linear probes under `protocol` (`linear_top1` for the default one)."""
    label = LINEAR_PROTOCOLS[protocol].label
    if protocol == DEFAULT_LINEAR:
        return Column("linear_top1", "linear top-1", "quality", higher_is_better=True, probe=label)
    return Column(f"{linear_kind(protocol)}_top1", f"linear top-1 ({label})", "quality", higher_is_better=True,
                  probe=label)


@RESULTS.register
@dataclass
class LinearResult(Result):
    """`results/linear[_<protocol>].json`: the best cell of the linear-probe grid and the grid (best first); the
    protocol is written only when it is not the default."""

    kind = "linear"
    rank = 20

    best: dict[str, Any]
    checkpoint: str | None = None
    data: str | None = None
    classes: int | None = None
    train_images: int | None = None
    val_images: int | None = None
    seed: int | None = None  # the probe's (None: a result written before it was recorded)
    grid: list[dict[str, Any]] | None = None
    protocol: str | None = None  # None: the default protocol

    _ORDER = ("checkpoint", "data", "protocol", "classes", "train_images", "val_images", "seed", "best", "grid")

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._ORDER if getattr(self, k) is not None}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LinearResult:
        return cls(**{k: obj[k] for k in cls._ORDER if k in obj})

    @classmethod
    def columns(cls) -> list[Column]:
        return [linear_column(p) for p in LINEAR_PROTOCOLS]

    @classmethod
    def collect(cls, run: RunDir) -> dict[str, Any]:
        return {linear_column(p).key: cls.from_json(read_result(run, linear_kind(p))).best["top1"]
                if run.result(linear_kind(p)).is_file() else math.nan for p in LINEAR_PROTOCOLS}

    @classmethod
    def probed(cls, run: RunDir) -> dict[str, Probed]:
        return {linear_column(p).key: made(run, linear_kind(p)) for p in LINEAR_PROTOCOLS
                if run.result(linear_kind(p)).is_file()}


def knn_column(protocol: str) -> Column:
    """The leaderboard column of k-NN probes under `protocol`, the top-1 at its `k` (`knn_probe_top1` for the default
    one; `knn_top1` is the training's k-NN monitor)."""
    proto = KNN_PROTOCOLS[protocol]
    named = "" if protocol == DEFAULT_KNN else f", {proto.label}"
    return Column(f"{knn_kind(protocol)}_probe_top1", f"k-NN probe top-1 (k={proto.k}{named})", "quality",
                  higher_is_better=True, probe=proto.label)


@RESULTS.register
@dataclass
class KnnResult(Result):
    """`results/knn[_<protocol>].json`: the k-NN probe's top-1 at its protocol's `k` (the leaderboard's), the top-1
    and top-5 at every k of the protocol (`by_k`), and what produced them."""

    kind = "knn"
    rank = 21

    top1: float
    k: int
    by_k: list[dict[str, Any]]
    protocol: str = DEFAULT_KNN
    feature: str | None = None
    temperature: float | None = None
    checkpoint: str | None = None
    data: str | None = None
    classes: int | None = None
    train_images: int | None = None
    val_images: int | None = None
    seed: int | None = None

    _ORDER = ("checkpoint", "data", "protocol", "feature", "temperature", "classes", "train_images", "val_images",
              "seed", "k", "top1", "by_k")

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._ORDER if getattr(self, k) is not None}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> KnnResult:
        return cls(**{k: obj[k] for k in cls._ORDER if k in obj})

    @classmethod
    def columns(cls) -> list[Column]:
        return [knn_column(p) for p in KNN_PROTOCOLS]

    @classmethod
    def collect(cls, run: RunDir) -> dict[str, Any]:
        """The top-1 of each registered protocol's result (a result whose protocol is not the one its file name says
        is a `BadValue`)."""
        out = cls.missing()
        for p in KNN_PROTOCOLS:
            if run.result(knn_kind(p)).is_file():
                res = cls.from_json(read_result(run, knn_kind(p)))
                if res.protocol != p:
                    raise BadValue(f"{run.result(knn_kind(p))} says it was made by the {res.protocol} k-NN protocol, "
                                   f"not {p}: {reprobe(run, knn_kind(p))}")
                out[knn_column(p).key] = res.top1
        return out

    @classmethod
    def probed(cls, run: RunDir) -> dict[str, Probed]:
        return {knn_column(p).key: made(run, knn_kind(p)) for p in KNN_PROTOCOLS if run.result(knn_kind(p)).is_file()}


def probe_seed(result: dict[str, Any]) -> int | None:
    """The seed a probe result (linear or dense JSON) was made with: its `seed`, else its first dense head's (a dense
    result written before the seed was recorded on top); None when it records none."""
    if result.get("seed") is not None:
        return int(result["seed"])
    heads = result.get("probes") or []
    return int(heads[0]["seed"]) if heads and heads[0].get("seed") is not None else None


def run_probe_seeds(run: RunDir) -> dict[str, int | None]:
    """The seed of each of `run`'s probe results (`linear`, `knn`, `dense_*`), by kind. A result that records none
    takes the one seed the run's other probe results record (vitsinks probes a run with one seed, and a linear result
    written before the seed was recorded sits beside a dense one whose heads record it); None when that is not one
    seed."""
    found = {p.stem: probe_seed(read_result(run, p.stem))
             for p in [*run.results_of("linear"), *run.results_of("knn"), *run.results_of("dense_")] if p.is_file()}
    known = {s for s in found.values() if s is not None}
    return {k: s if s is not None else (next(iter(known)) if len(known) == 1 else None) for k, s in found.items()}


def made(run: RunDir, kind: str) -> Probed:
    """How `run`'s probe result `kind` was made: its seed (`run_probe_seeds`) and the file name of its checkpoint."""
    checkpoint = read_result(run, kind).get("checkpoint")
    return Probed(run_probe_seeds(run).get(kind), Path(checkpoint).name if checkpoint else None)


def dense_kind(data: str, protocol: str, backend: str = NATIVE) -> str:
    """The result kind (file stem) of a dense probe: `dense_<data>` under the default protocol, else
    `dense_<data>_<protocol>`; `_mmseg` appended for the mmseg backend's."""
    return (f"dense_{data}" + ("" if protocol == DEFAULT_PROTOCOL else f"_{protocol}")
            + ("" if backend == NATIVE else f"_{backend}"))


def parse_dense_kind(kind: str) -> tuple[str, str, str]:
    """(data, protocol, backend) of a `dense_kind` (the longest protocol name that ends it, else the default
    protocol)."""
    rest, backend = kind.removeprefix("dense_"), NATIVE
    if rest.endswith(f"_{MMSEG}"):
        rest, backend = rest.removesuffix(f"_{MMSEG}"), MMSEG
    for proto in sorted(DENSE_PROTOCOLS, key=len, reverse=True):
        if proto != DEFAULT_PROTOCOL and rest.endswith(f"_{proto}"):
            return rest[: -len(proto) - 1], proto, backend
    return rest, DEFAULT_PROTOCOL, backend


def dense_column(data: str, protocol: str, backend: str = NATIVE) -> Column:
    """The leaderboard column of dense probes of `data` under `protocol` by `backend` (one column per data,
    protocol and backend)."""
    label = (DATASETS[data].label or data) if data in DATASETS else data
    by = "" if backend == NATIVE else f", {backend}"
    return Column(dense_kind(data, protocol, backend), f"{label} mIoU ({DENSE_PROTOCOLS[protocol].label}{by})",
                  "quality", higher_is_better=True, probe=dense_probe(protocol, backend))


@RESULTS.register
@dataclass
class DenseResult(Result):
    """`results/dense_<data>[_<protocol>][_mmseg].json`: the mIoU (mean over probe seeds) and what produced it; the
    keys beyond the mIoU, the protocol and the backend are kept in `details`, in order. The backend is written only
    when it is not the native one."""

    kind = "dense"
    rank = 30

    mIoU: float  # noqa: N815 - the JSON key
    protocol: str = DEFAULT_PROTOCOL
    details: dict[str, Any] = field(default_factory=dict)
    recorded_protocol: bool = True  # False: a result written before the protocol was recorded
    backend: str = NATIVE

    def to_json(self) -> dict[str, Any]:
        out = dict(self.details)
        if self.recorded_protocol:
            out["protocol"] = self.protocol
        if self.backend != NATIVE:
            out["backend"] = self.backend
        out["mIoU"] = self.mIoU
        order = ["checkpoint", "data", "classes", "protocol", "backend", "protocol_settings", "overrides", "mIoU"]
        head = {k: out.pop(k) for k in order if k in out}  # the order `eval.dense` writes the keys in
        return {**head, **out}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DenseResult:
        return cls(obj["mIoU"], obj.get("protocol", DEFAULT_PROTOCOL),
                   {k: v for k, v in obj.items() if k not in ("mIoU", "protocol", "backend")}, "protocol" in obj,
                   obj.get("backend", NATIVE))

    @classmethod
    def columns(cls) -> list[Column]:
        return [dense_column(d, p) for p in DENSE_PROTOCOLS for d in with_masks()]

    @classmethod
    def collect(cls, run: RunDir) -> dict[str, Any]:
        """Every dense result of the run, in % (a result whose protocol or backend is not the one its file name
        says is a `BadValue`); data without a column of its own get one named after the data."""
        out = cls.missing()
        for path in run.results_of("dense_"):
            data, proto, backend = parse_dense_kind(path.stem)
            res = cls.from_json(read_result(run, path.stem))
            if (res.protocol, res.backend) != (proto, backend):
                raise BadValue(f"{path} says it was made by the {res.protocol} dense protocol ({res.backend} "
                               f"backend), not {proto} ({backend}): rerun python -m vitsinks.eval.dense on that run")
            out[dense_kind(data, proto, backend)] = 100 * res.mIoU
        return out

    @classmethod
    def probed(cls, run: RunDir) -> dict[str, Probed]:
        return {dense_kind(*parse_dense_kind(p.stem)): made(run, p.stem) for p in run.results_of("dense_")}

    @classmethod
    def extra_columns(cls, keys: set[str]) -> list[Column]:
        """Columns for collected dense keys of data without masks in the registry (in `keys`' sorted order)."""
        known = {c.key for c in cls.columns()}
        return [dense_column(*parse_dense_kind(k)) for k in sorted(keys - known) if k.startswith("dense_")]
