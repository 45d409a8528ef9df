"""The linear-probe protocols (`eval.linear_protocol`): the fixed recipe of `vitsinks.eval.linear`'s grid of heads.

A protocol fixes what each head reads (`pools`: the [CLS] of the last blocks, optionally with the mean patch token
or with the concatenated patches, the last block's patch tokens average-pooled to a `patch_grid` x `patch_grid` grid)
and its optimiser (SGD with `momentum` and `weight_decay`, a cosine over the steps); the grid's sizes are the run's
`eval.linear_*` settings (learning rates, last blocks, epochs, batch size). `dinov2` is DINOv2's protocol, the
default, whose results are `results/linear.json`; another protocol's are `results/linear_<name>.json`, each with its
own leaderboard column: `patches` reads the concatenated patches (`results/linear_patches.json`). The dense
probes' protocols are `vitsinks.probes.dense_protocols`. A new protocol is a `LinearProtocol` registered with
`LINEAR_PROTOCOLS.register` in a module of `plugins=` (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from vitsinks.utils.registry import Registry

# [CLS] of the last blocks; the same and the mean patch token of the last block (DINOv2's two, every protocol's
# default); the same and the last block's patch tokens average-pooled to a fixed grid, flattened cell by cell
DINOV2_POOLS = ("cls", "cls+avgpool")
PATCHES = "cls+patches"
POOLS = (*DINOV2_POOLS, PATCHES)


@dataclass(frozen=True)
class LinearProtocol:
    """One linear-probe protocol: `label` names it in tables (its leaderboard column's `Column.probe`)."""

    name: str
    label: str
    pools: tuple[str, ...] = DINOV2_POOLS  # each a grid axis value; a subset of POOLS
    momentum: float = 0.9
    weight_decay: float = 0.0
    patch_grid: int = 2  # the side of the grid the `cls+patches` pool averages the patch tokens to

    def __post_init__(self) -> None:
        if not self.pools or set(self.pools) - set(POOLS):
            raise ValueError(f"linear protocol {self.name!r}: pools must be among {POOLS}, got {self.pools}")
        if self.patch_grid < 1:
            raise ValueError(f"linear protocol {self.name!r}: patch_grid must be >= 1, got {self.patch_grid}")

    @property
    def grid(self) -> int:
        """The side of the patch grid its features need: `patch_grid` when a head reads `cls+patches`, else 0."""
        return self.patch_grid if PATCHES in self.pools else 0


LINEAR_PROTOCOLS: Registry[LinearProtocol] = Registry(
    "linear-probe protocol", "a `LinearProtocol` registered with `LINEAR_PROTOCOLS.register` in a module of "
    "`plugins=` (docs/extending.md)", fields=("eval.linear_protocol",))
DEFAULT_LINEAR = LINEAR_PROTOCOLS.register(LinearProtocol("dinov2", "linear probe (DINOv2 protocol)")).name
# [CLS] with the concatenated patches: the feature size is the same at every resolution (D x (n_last + 4))
LINEAR_PROTOCOLS.register(LinearProtocol("patches", "concatenated-patches linear probe", pools=(PATCHES,)))


def linear_kind(protocol: str) -> str:
    """The result kind (file stem) of a linear probe: `linear` under the default protocol, else `linear_<name>`."""
    return "linear" if protocol == DEFAULT_LINEAR else f"linear_{protocol}"
