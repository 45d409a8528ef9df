"""The k-NN probe (`eval.knn`): DINO's weighted k-NN classifier on the features the linear probe caches, no training.

Each validation image is classified by the training images nearest to it: cosine similarity of the L2-normalised
features (`KnnProtocol.feature`), the `k` most similar vote exp(cosine / T) for their class (lightly's `knn_predict`,
as the training's k-NN monitor, `objectives.monitors`), the class with the most weight wins. Top-1 and top-5 are
reported for every k of the protocol. `vitsinks.run.probing.linear_probe` runs it on the features it extracted.
"""

from __future__ import annotations

from typing import Any

import torch

from vitsinks.objectives.monitors import knn_ranked
from vitsinks.probes.knn_protocols import KnnProtocol


def knn_input(feats: dict[str, torch.Tensor], feature: str) -> torch.Tensor:
    """The vector (N, D) of each image that `feature` (`knn_protocols.FEATURES`) names, from the linear probe's cached
    features: `cls`, the pooled token of the last block; `avgpool`, its mean patch token; `cls+avgpool`, both."""
    cls = feats["cls"][:, -1]
    if feature == "cls":
        return cls
    if feature == "avgpool":
        return feats["patch_mean"]
    return torch.cat([cls, feats["patch_mean"]], dim=1)


def knn_predictions(train: dict[str, torch.Tensor], val: dict[str, torch.Tensor], classes: int,
                    protocol: KnnProtocol, top: int = 1, device: torch.device | str = "cpu") -> dict[int, torch.Tensor]:
    """For each k of `protocol`: the `top` classes (N, top) the `k` nearest training images vote for each validation
    image, most voted first (computed in float32 on `device`, returned on the CPU)."""
    bank, queries = (knn_input(feats, protocol.feature).to(device) for feats in (train, val))
    labels = train["label"].to(device)
    return {k: knn_ranked(queries, bank, labels, classes, k, protocol.temperature, top).cpu() for k in protocol.ks}


def knn_scores(train: dict[str, torch.Tensor], val: dict[str, torch.Tensor], classes: int, protocol: KnnProtocol,
               device: torch.device | str = "cpu") -> list[dict[str, Any]]:
    """Top-1 and top-m (m = min(5, classes)) in % of the k-NN classifier for each k of `protocol` (in its order):
    `{"k", "top1", "top<m>"}`, with `neighbours`, the training images that voted, where k exceeds their number."""
    m, n = min(5, classes), len(train["label"])
    out = []
    for k, ranked in knn_predictions(train, val, classes, protocol, m, device).items():
        hit = ranked == val["label"][:, None]
        out.append({"k": k, **({"neighbours": n} if k > n else {}), "top1": float(hit[:, 0].float().mean() * 100),
                    f"top{m}": float(hit.any(1).float().mean() * 100)})
    return out
