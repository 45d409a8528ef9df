"""The SSL monitors of every validation (`monitors.*`, docs/training.md#the-ssl-monitors) on the embeddings the
objective validates on: `val/knn_top1` (lightly's weighted k-NN against a bank of training images, embedded again at
every validation) and `val/rankme` (RankMe, Garrido et al. 2023); also the decoded validation views the objectives
read (`probe_batches`) and their embedding (`embed`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from lightly.utils.benchmarking import knn_predict
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import Dataset

from vitsinks.data import read_item
from vitsinks.data.selection import permutation, selection_transform
from vitsinks.utils.distributed import gather_objects, rank_world
from vitsinks.utils.errors import BadValue, NonFinite

# (images, labels) of one validation batch, decoded, on the CPU
ProbeBatch = tuple[torch.Tensor, torch.Tensor]
# (embeddings (B, D), labels (B,)) of one batch, on the device
Embedded = tuple[torch.Tensor, torch.Tensor]
KNN, RANKME = "val/knn_top1", "val/rankme"  # the logged keys
RANKME_EPS = 1e-7  # the paper's epsilon added to every normalised singular value
KNN_CHUNK = 1024  # queries per similarity matrix (chunk x bank floats)


def probe_batches(split: Dataset, cfg: DictConfig, max_images: int = 2048, shard: tuple[int, int] = (0, 1),
                  batch_size: int = 256, pin: bool = False,
                  transform: Callable[[Any], torch.Tensor] | None = None) -> list[ProbeBatch]:
    """The decoded views (`transform`, default the online probe's) of the first `max_images` images of `split` in the
    seeded `cfg.selection` order; shard `(rank, world)` takes every world-th from the rank-th; `pin`: pinned memory."""
    tf = transform or selection_transform(cfg.views.global_size, cfg.selection)
    rank, world = shard
    order = permutation(len(split), cfg.selection.seed)[:max_images][rank::world]  # type: ignore[arg-type]
    batches = []
    for lo in range(0, len(order), batch_size):
        read = (read_item(split, i, cfg.data.on_bad_image) for i in order[lo : lo + batch_size])
        items = [it for it in read if it is not None]
        if items:
            x, y = torch.stack([tf(img) for img, _ in items]), torch.tensor([label for _, label in items])
            batches.append((x.pin_memory(), y.pin_memory()) if pin else (x, y))
    return batches


@torch.no_grad()
def embed(backbone: nn.Module, batches: list[ProbeBatch], device: torch.device,
          autocast: Callable[[], Any]) -> list[Embedded]:
    """Each batch's embeddings (the backbone's output) under `autocast()`, with its labels, on `device`."""
    out = []
    for x, y in batches:
        with autocast():
            out.append((backbone(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)))
    return out


def rankme(z: torch.Tensor, eps: float = RANKME_EPS) -> float:
    """RankMe of the embeddings `z` (N, D): exp(-sum_k p_k log p_k), p_k = s_k / ||s||_1 + eps over the singular
    values s of `z`, in float64; 0 for a matrix of zeros. NaN or inf in `z` is `NonFinite`."""
    if z.ndim != 2 or 0 in z.shape:
        raise BadValue(f"RankMe needs an N x D matrix of embeddings with N, D >= 1, got shape {tuple(z.shape)}")
    z64 = z.detach().to("cpu", torch.float64)
    if not torch.isfinite(z64).all():
        raise NonFinite("the embeddings hold NaN or inf: RankMe is not computed from them")
    s = torch.linalg.svdvals(z64)
    total = s.sum()
    if total == 0:
        return 0.0
    p = s / total + eps
    return float(torch.exp(-(p * p.log()).sum()))


def knn_classify(queries: torch.Tensor, bank: torch.Tensor, bank_labels: torch.Tensor, num_classes: int, k: int,
                 temperature: float) -> torch.Tensor:
    """The top-1 class of each query (N,) by lightly's weighted k-NN (`knn_ranked`)."""
    return knn_ranked(queries, bank, bank_labels, num_classes, k, temperature)[:, 0]


def knn_ranked(queries: torch.Tensor, bank: torch.Tensor, bank_labels: torch.Tensor, num_classes: int, k: int,
               temperature: float, top: int = 1) -> torch.Tensor:
    """The `top` classes of each query (N, top), most voted first, by lightly's weighted k-NN (`knn_predict`): the
    `k` (at most the bank's size) most cosine-similar bank rows vote exp(cosine / temperature) for their label."""
    if len(bank) == 0:
        raise BadValue("the k-NN bank is empty: there is no neighbour to vote")
    bank_t = F.normalize(bank.float(), dim=1).T.contiguous()
    k = min(k, len(bank))
    votes = [knn_predict(F.normalize(q.float(), dim=1), bank_t, bank_labels, num_classes, k, temperature)[:, :top]
             for q in queries.split(KNN_CHUNK)]
    return torch.cat(votes) if votes else torch.zeros(0, top, dtype=torch.long, device=queries.device)


def joined(parts: list[Embedded], shard: tuple[int, int], device: torch.device) -> Embedded:
    """One (embeddings (N, D) float32, labels (N,)) from this rank's batches, and every rank's when `shard[1] > 1`
    (a collective)."""
    local = [(f.float(), y) for f, y in parts if len(f)]
    if shard[1] > 1:
        local = [(f.to(device), y.to(device)) for rank in gather_objects([(f.cpu(), y.cpu()) for f, y in local])
                 for f, y in rank]
    if not local:
        return torch.zeros(0, 0, device=device), torch.zeros(0, dtype=torch.long, device=device)
    return torch.cat([f for f, _ in local]), torch.cat([y for _, y in local])


def check_finite(z: torch.Tensor, what: str) -> None:
    """`NonFinite` naming `what` when `z` holds NaN or inf."""
    if not torch.isfinite(z).all():
        raise NonFinite(f"the {what} embeddings are not finite (NaN or inf): the run diverged. Lower train.lr and "
                        f"relaunch to resume from the last checkpoint")


class Monitors:
    """A run's monitors: the k-NN bank is decoded from `bank_split` once, in the validation view `transform`; called
    with one validation's embeddings, the metrics (`KNN`, `RANKME`). A k-NN that cannot be made (a bank of fewer
    than two classes) is left out, said once."""

    def __init__(self, cfg: DictConfig, bank_split: Dataset, num_classes: int, device: torch.device,
                 autocast: Callable[[], Any], transform: Callable[[Any], torch.Tensor]) -> None:
        self.cfg, self.settings = cfg, cfg.monitors
        self.split, self.num_classes, self.device, self.autocast = bank_split, num_classes, device, autocast
        self.transform = transform
        self._bank: tuple[tuple[int, int], list[ProbeBatch]] | None = None  # (shard, this rank's decoded share)
        self._said: set[str] = set()

    def bank_batches(self, shard: tuple[int, int]) -> list[ProbeBatch]:
        """This shard's decoded bank images, decoded on the first call."""
        if self._bank is None or self._bank[0] != shard:
            self._bank = shard, probe_batches(self.split, self.cfg, self.settings.knn_bank, shard,
                                              pin=self.device.type == "cuda", transform=self.transform)
        return self._bank[1]

    def __call__(self, backbone: nn.Module, val: list[Embedded], shard: tuple[int, int] = (0, 1)) -> dict[str, float]:
        """The monitors of one validation from this shard's embeddings `val` (`backbone` embeds the bank); a
        collective when `shard` has several ranks, each getting the one-process numbers."""
        feats, labels = joined(val, shard, self.device)
        check_finite(feats, "validation")
        out: dict[str, float] = {}
        if len(feats) == 0:
            self.say("no readable validation image: no k-NN, no RankMe")
            return out
        if self.settings.knn_bank > 0:
            was = backbone.training
            backbone.eval()
            try:
                bank, bank_labels = joined(embed(backbone, self.bank_batches(shard), self.device, self.autocast),
                                           shard, self.device)
            finally:
                backbone.train(was)
            check_finite(bank, "k-NN bank's")
            classes = len(bank_labels.unique())
            if classes >= 2:
                n = max(self.num_classes, int(max(labels.max(), bank_labels.max())) + 1)
                pred = knn_classify(feats, bank, bank_labels, n, self.settings.knn_k, self.settings.knn_temperature)
                out[KNN] = float((pred == labels).float().mean())
            else:
                self.say(f"the k-NN bank ({len(bank)} readable training images) holds {classes} class"
                         f"{'' if classes == 1 else 'es'}: no k-NN top-1 (it needs two; raise monitors.knn_bank)")
        if self.settings.rankme:
            out[RANKME] = rankme(feats)
        return out

    def say(self, what: str) -> None:
        """Print `what` once per run, on the first rank."""
        if what not in self._said and rank_world()[0] == 0:
            print(f"monitors: {what}", flush=True)
        self._said.add(what)
