"""The sink rules: when a head's attention is a sink event, and whether the event is NOP-like or broadcast-like.
`SinkRules` is the one representation of the `diagnostics` rule settings; the thresholds are named once here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only: the rules import nothing of the schema (or the models) at run time
    from vitsinks.configs.schema import DiagnosticsConfig

CLASSES = ("nop", "broadcast", "unclassified")  # the values 0, 1, 2 of `classify`
ROUTED_MIN = 0.9  # relaxed rule: a sink event routes at least this share of the attention to one key
DEF1_EPS_MAX = 0.5  # Definition 1: above this eps a head can have several sinks
NOP_MAX, BROADCAST_MIN, BROADCAST_MAX_RANK = 0.2, 0.5, 1.5
# Where block 0 is counted (`diagnostics.summary.block0_apart`): apart except in a one-block model, or always
BLOCK0_POLICIES = ("one_block_counts", "always_apart")
DEFAULT_BLOCK0_POLICY = BLOCK0_POLICIES[0]


def check_block0_policy(policy: str) -> str:
    """`policy` if it is one of `BLOCK0_POLICIES`, else a `BadValue` naming them."""
    if policy not in BLOCK0_POLICIES:
        raise BadValue(f"unknown block-0 policy {policy!r}: use {' or '.join(BLOCK0_POLICIES)}")
    return policy


def events(d: dict[str, np.ndarray], rule: str = "relaxed", eps: float = 0.5) -> np.ndarray:
    """Boolean sink events (images, blocks, heads): `relaxed` (routed_frac >= 0.9) or `def1` (min_a >= 1 - eps)."""
    if rule == "relaxed":
        return d["routed_frac"] >= ROUTED_MIN
    if rule == "def1":
        if not 0 < eps <= DEF1_EPS_MAX:  # eps also comes from Python callers (the sink table's sweep of eps)
            raise BadValue(f"Definition 1 needs 0 < eps <= {DEF1_EPS_MAX:g}, got {eps}")
        return d["min_a"] >= 1 - eps
    raise BadValue(f"unknown sink rule {rule!r}: use relaxed or def1")


def classify(d: dict[str, np.ndarray], ratio: str = "ratio_out", use_rank: bool = True) -> np.ndarray:
    """0 NOP-like (ratio <= 0.2), 1 broadcast-like (ratio >= 0.5 and stable rank <= 1.5), 2 unclassified;
    `ratio="ratio_head", use_rank=False` is the reference numbers' ratio-only rule (docs/fidelity.md)."""
    r = d[ratio]
    broadcast = r >= BROADCAST_MIN
    if use_rank:
        broadcast &= d["stable_rank"] <= BROADCAST_MAX_RANK
    return np.where(r <= NOP_MAX, 0, np.where(broadcast, 1, 2))


@dataclass(frozen=True)
class SinkRules:
    """How events and classes are read from the diagnostic fields; `from_config` reads the `diagnostics` group."""

    rule: str = "relaxed"  # relaxed | def1
    eps: float = 0.5  # def1 only
    ratio: str = "ratio_out"  # ratio_out | ratio_head
    use_stable_rank: bool = True  # broadcast-like also needs stable rank <= BROADCAST_MAX_RANK
    block0_policy: str = DEFAULT_BLOCK0_POLICY  # see BLOCK0_POLICIES

    def __post_init__(self) -> None:
        check_block0_policy(self.block0_policy)

    @classmethod
    def from_config(cls, cfg: DiagnosticsConfig) -> SinkRules:
        """The rules of a `DiagnosticsConfig` (or its DictConfig; without `block0_policy`: the default)."""
        return cls(str(cfg.rule), float(cfg.eps), str(cfg.ratio), bool(cfg.use_stable_rank),
                   str(getattr(cfg, "block0_policy", DEFAULT_BLOCK0_POLICY)))

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SinkRules:
        """The rules stored in a summary's `rule` record (without `block0_policy`: the default)."""
        return cls(str(record["events"]), float(record["eps"]), str(record["ratio"]), bool(record["use_stable_rank"]),
                   str(record.get("block0_policy", DEFAULT_BLOCK0_POLICY)))

    def events(self, d: dict[str, np.ndarray]) -> np.ndarray:
        """Boolean sink events of arrays of fields (see `events`)."""
        return events(d, self.rule, self.eps)

    def classify(self, d: dict[str, np.ndarray]) -> np.ndarray:
        """0 NOP-like, 1 broadcast-like, 2 unclassified (see `classify`)."""
        return classify(d, self.ratio, self.use_stable_rank)

    def event_class(self, d: dict[str, np.ndarray]) -> np.ndarray:
        """none / other / nop / broadcast per entry of arrays of fields (any shape)."""
        names = np.array([{"nop": "nop", "broadcast": "broadcast"}.get(c, "other") for c in CLASSES])
        return np.where(self.events(d), names[self.classify(d)], "none")

    def record(self) -> dict[str, Any]:
        """The settings as summary.json's `rule` stores them (`block0_policy` only when not the default)."""
        out: dict[str, Any] = {"events": self.rule, "eps": self.eps, "ratio": self.ratio,
                               "use_stable_rank": self.use_stable_rank}
        if self.block0_policy != DEFAULT_BLOCK0_POLICY:
            out["block0_policy"] = self.block0_policy
        return out
