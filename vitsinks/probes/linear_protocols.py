"""The linear-probe protocols (`eval.linear_protocol`): the fixed recipe of `vitsinks.eval.linear`'s grid of heads.

A protocol fixes what each head reads (`pools`: the [CLS] of the last blocks, optionally with the mean patch token)
and its optimiser (SGD with `momentum` and `weight_decay`, a cosine over the steps); the grid's sizes are the run's
`eval.linear_*` settings (learning rates, last blocks, epochs, batch size). `dinov2` is DINOv2's protocol, the
default, whose results are `results/linear.json`; another protocol's are `results/linear_<name>.json`, each with its
own leaderboard column. The dense probes' protocols are `vitsinks.probes.dense_protocols`. A new protocol is a
`LinearProtocol` registered with `LINEAR_PROTOCOLS.register` in a module of `plugins=` (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from vitsinks.utils.registry import Registry

POOLS = ("cls", "cls+avgpool")  # [CLS] of the last blocks; the same and the mean patch token of the last block


@dataclass(frozen=True)
class LinearProtocol:
    """One linear-probe protocol: `label` names it in tables (its leaderboard column's `Column.probe`)."""

    name: str
    label: str
    pools: tuple[str, ...] = POOLS  # each a grid axis value; a subset of POOLS
    momentum: float = 0.9
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not self.pools or set(self.pools) - set(POOLS):
            raise ValueError(f"linear protocol {self.name!r}: pools must be among {POOLS}, got {self.pools}")


LINEAR_PROTOCOLS: Registry[LinearProtocol] = Registry(
    "linear-probe protocol", "a `LinearProtocol` registered with `LINEAR_PROTOCOLS.register` in a module of "
    "`plugins=` (docs/extending.md)", fields=("eval.linear_protocol",))
DEFAULT_LINEAR = LINEAR_PROTOCOLS.register(LinearProtocol("dinov2", "linear probe (DINOv2 protocol)")).name


def linear_kind(protocol: str) -> str:
    """The result kind (file stem) of a linear probe: `linear` under the default protocol, else `linear_<name>`."""
    return "linear" if protocol == DEFAULT_LINEAR else f"linear_{protocol}"
