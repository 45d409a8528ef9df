"""The k-NN probe protocols (`eval.knn_protocol`): the fixed recipe of the weighted k-NN classifier that
`vitsinks.eval.linear` runs on the features it caches (`eval.knn`).

A protocol fixes the feature each image is represented by (`feature`: the final-norm [CLS] of the last block, the
mean patch token of the last block, or both concatenated), the neighbourhood sizes it reports (`ks`), the one shown
in its leaderboard column (`k`) and the temperature of the vote: the `k` most cosine-similar training features (of
the L2-normalised vectors) each vote exp(cosine / `temperature`) for their class. `dino` is DINO's protocol
(Caron et al. 2021: [CLS], T = 0.07, k = 10, 20, 100, 200, 20 its headline), the default, whose results are
`results/knn.json`; another protocol's are `results/knn_<name>.json`, each with its own leaderboard column. A new
protocol is a `KnnProtocol` registered with `KNN_PROTOCOLS.register` in a module of `plugins=` (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from vitsinks.utils.registry import Registry

# the cached features a protocol may read: [CLS] of the last block (a model without [CLS]: its mean patch token),
# the mean patch token of the last block, or the two concatenated
FEATURES = ("cls", "avgpool", "cls+avgpool")


@dataclass(frozen=True)
class KnnProtocol:
    """One k-NN protocol: `label` names it in tables (its leaderboard column's `Column.probe`)."""

    name: str
    label: str
    ks: tuple[int, ...] = (10, 20, 100, 200)  # every k reported (at most the training set's size each)
    k: int = 20  # the k of the leaderboard column; one of ks
    temperature: float = 0.07
    feature: str = "cls"  # one of FEATURES

    def __post_init__(self) -> None:
        problem = ("ks must be distinct positive integers" if not self.ks or min(self.ks) < 1
                   or len(set(self.ks)) < len(self.ks) else
                   f"k={self.k} must be one of ks {self.ks}" if self.k not in self.ks else
                   f"temperature must be > 0, got {self.temperature}" if not self.temperature > 0 else
                   f"feature must be one of {FEATURES}, got {self.feature!r}" if self.feature not in FEATURES else "")
        if problem:
            raise ValueError(f"k-NN protocol {self.name!r}: {problem}")


KNN_PROTOCOLS: Registry[KnnProtocol] = Registry(
    "k-NN probe protocol", "a `KnnProtocol` registered with `KNN_PROTOCOLS.register` in a module of `plugins=` "
    "(docs/extending.md)", fields=("eval.knn_protocol",))
DEFAULT_KNN = KNN_PROTOCOLS.register(KnnProtocol("dino", "weighted k-NN (DINO protocol)")).name


def knn_kind(protocol: str) -> str:
    """The result kind (file stem) of a k-NN probe: `knn` under the default protocol, else `knn_<name>`."""
    return "knn" if protocol == DEFAULT_KNN else f"knn_{protocol}"
