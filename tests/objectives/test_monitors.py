"""The SSL monitors: RankMe against closed forms and a float64 recomputation, the weighted k-NN against a hand
count and a brute-force recomputation, and the monitors' wiring (bank, views, embeddings) against an independent
image-by-image computation; the cases without an answer (an empty bank, one class, NaN) give none."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from tests.helpers.distributed import run_ranks
from tests.helpers.tiny import tiny_cfg
from vitsinks.data import build_dataset
from vitsinks.data.imagefolder import BadImage
from vitsinks.data.selection import permutation
from vitsinks.diagnostics import selection_transform
from vitsinks.models import model_from_config
from vitsinks.objectives import Runtime, build_objective
from vitsinks.objectives.monitors import (
    KNN,
    RANKME,
    RANKME_EPS,
    Monitors,
    embed,
    knn_classify,
    probe_batches,
    rankme,
)
from vitsinks.utils.distributed import rank_world
from vitsinks.utils.errors import BadValue, NonFinite

CPU = torch.device("cpu")
NO_AUTOCAST = Runtime(CPU).autocast


def orthogonal(n: int, k: int, seed: int) -> torch.Tensor:
    """An n x k float64 matrix with orthonormal columns (seeded)."""
    q, _ = torch.linalg.qr(torch.randn(n, k, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))
    return q


def entropy_rank(s: list[float], eps: float = RANKME_EPS) -> float:
    """RankMe from singular values by the paper's formula, in plain Python."""
    p = [v / sum(s) + eps for v in s]
    return math.exp(-sum(x * math.log(x) for x in p))


# ---- RankMe -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("r", [1, 3, 8, 16])
def test_rankme_of_orthonormal_columns_of_rank_r_is_r(r: int) -> None:
    n, d = 64, 16
    z = torch.cat([orthogonal(n, r, r), torch.zeros(n, d - r, dtype=torch.float64)], 1) @ orthogonal(d, d, 99).T
    expected = entropy_rank([1.0] * r + [0.0] * (d - r))  # r singular values 1, the rest 0
    assert rankme(z) == pytest.approx(expected, rel=1e-9)
    assert rankme(z) == pytest.approx(r, rel=1e-4)  # the eps terms move it by less than 1e-4


def test_rankme_of_a_rank_one_matrix_is_about_one() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(100, 1, generator=g) @ torch.randn(1, 32, generator=g)  # every row one direction
    assert rankme(z) == pytest.approx(1.0, abs=1e-4)


def test_rankme_is_the_entropy_of_the_singular_values_and_float32_matches_float64() -> None:
    s = [5.0, 3.0, 1.0, 0.5, 0.1]
    z64 = orthogonal(40, 5, 1) @ torch.diag(torch.tensor(s, dtype=torch.float64)) @ orthogonal(12, 5, 2).T
    assert rankme(z64) == pytest.approx(entropy_rank(s + [0.0] * 7), rel=1e-9)
    assert rankme(z64.float()) == pytest.approx(rankme(z64), rel=1e-5)  # float32 embeddings, float64 inside
    rows = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    assert rankme(7.5 * z64[rows]) == pytest.approx(rankme(z64), rel=1e-9)  # scale and sample order do not count


def test_rankme_of_zeros_is_zero_and_of_nan_or_nothing_is_an_error() -> None:
    assert rankme(torch.zeros(10, 4)) == 0.0
    z = torch.ones(10, 4)
    z[3, 1] = math.nan
    with pytest.raises(NonFinite, match="NaN or inf"):
        rankme(z)
    with pytest.raises(BadValue, match="N x D"):
        rankme(torch.zeros(0, 4))


# ---- the weighted k-NN --------------------------------------------------------------------------------------------

def test_weighted_knn_by_hand_the_vote_of_k_neighbours_with_temperature() -> None:
    bank = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])  # cosines to the query: 1, 0.8, 0
    labels = torch.tensor([0, 1, 1])
    query = torch.tensor([[3.0, 0.0]])  # its length does not count: cosine similarity
    def vote(k: int, t: float) -> int:
        return int(knn_classify(query, 2.0 * bank, labels, 2, k, t)[0])
    assert vote(1, 1.0) == 0 and vote(2, 1.0) == 0  # e^1 against e^0.8
    assert vote(3, 1.0) == 1  # e^1 = 2.72 against e^0.8 + e^0 = 3.23
    assert vote(3, 0.1) == 0  # e^10 against e^8 + e^0
    assert vote(50, 1.0) == 1  # k above the bank's size: every bank row votes


def test_well_separated_clusters_are_classified_without_error() -> None:
    g = torch.Generator().manual_seed(0)
    centres = orthogonal(8, 4, 5).T.float()  # 4 orthonormal directions in 8 dimensions
    def cloud(per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(4).repeat_interleave(per_class)
        return centres[y] + 0.05 * torch.randn(len(y), 8, generator=g), y
    bank, bank_y = cloud(10)
    queries, y = cloud(25)
    for k in (1, 20, 40):
        assert torch.equal(knn_classify(queries, bank, bank_y, 4, k, 0.07), y)


def _brute_force_knn(q: np.ndarray, bank: np.ndarray, labels: np.ndarray, classes: int, k: int, t: float) -> list:
    """The InstDisc / DINO weighted k-NN, one query at a time in float64."""
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    bn = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    out = []
    for row in qn:
        sim = bn @ row
        votes = np.zeros(classes)
        for j in np.argsort(-sim)[:k]:
            votes[labels[j]] += math.exp(sim[j] / t)
        out.append(int(np.argmax(votes)))
    return out


def test_weighted_knn_equals_a_brute_force_recomputation() -> None:
    g = torch.Generator().manual_seed(1)
    bank, queries = torch.randn(300, 16, generator=g), torch.randn(2500, 16, generator=g)  # queries over 2 chunks
    labels = torch.randint(0, 5, (300,), generator=g)
    got = knn_classify(queries, bank, labels, 5, 20, 0.07).tolist()
    assert got == _brute_force_knn(queries.double().numpy(), bank.double().numpy(), labels.numpy(), 5, 20, 0.07)


def test_knn_with_an_empty_bank_is_an_error() -> None:
    with pytest.raises(BadValue, match="bank is empty"):
        knn_classify(torch.ones(3, 4), torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 2, 20, 0.07)


# ---- the monitors of a run ----------------------------------------------------------------------------------------

class Colours(Dataset):
    """Solid images whose label is their colour (red, green, blue: `classes` of them), or one label for all
    (`single`); `bad`: every image unreadable."""

    RGB = ((255, 0, 0), (0, 255, 0), (0, 0, 255))

    def __init__(self, n: int, classes: int = 3, single: bool = False, bad: bool = False) -> None:
        self.n, self.classes, self.single, self.bad = n, classes, single, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        if self.bad:
            raise BadImage(f"image {i} is unreadable")
        label = i % self.classes
        return Image.new("RGB", (16, 16), self.RGB[label]), 0 if self.single else label


class MeanColour(nn.Module):
    """A backbone whose embedding is an image's mean colour (3 numbers), or NaN (`broken`)."""

    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.broken = broken

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean((2, 3)) * (math.nan if self.broken else 1.0)


def _monitors(runs: Path, split: Dataset, classes: int, *overrides: str) -> Monitors:
    cfg = tiny_cfg(runs, "views.global_size=16", *overrides)
    return Monitors(cfg, split, classes, CPU, NO_AUTOCAST, selection_transform(16, cfg.selection))


def _val(cfg_runs: Path, split: Dataset, backbone: nn.Module) -> list:
    cfg = tiny_cfg(cfg_runs, "views.global_size=16")
    return embed(backbone, probe_batches(split, cfg, batch_size=7), CPU, NO_AUTOCAST)


def test_colour_classes_are_told_apart_by_the_knn_and_the_rank_is_their_number(runs: Path) -> None:
    m = _monitors(runs, Colours(30), 3, "monitors.knn_k=5")
    got = m(MeanColour(), _val(runs, Colours(12), MeanColour()))
    assert got[KNN] == 1.0  # three colours, three classes: every neighbour is of the query's class
    assert 1.5 < got[RANKME] < 3.0  # three distinct embeddings, not orthogonal: rank 3, unequal singular values


def test_a_bank_of_one_class_or_of_no_image_gives_no_knn_and_says_so_once(runs: Path, capsys) -> None:
    val = _val(runs, Colours(12), MeanColour())
    one = _monitors(runs, Colours(30, single=True), 3)
    assert KNN not in one(MeanColour(), val) and RANKME in one(MeanColour(), val)
    assert capsys.readouterr().out.count("holds 1 class: no k-NN top-1") == 1
    none = _monitors(runs, Colours(30, bad=True), 3)
    assert KNN not in none(MeanColour(), val)
    assert "bank (0 readable training images) holds 0 classes" in capsys.readouterr().out
    off = _monitors(runs, Colours(30), 3, "monitors.knn_bank=0", "monitors.rankme=false")
    assert off(MeanColour(), val) == {}


def test_nan_embeddings_are_an_error_not_a_monitor(runs: Path) -> None:
    m = _monitors(runs, Colours(30), 3)
    with pytest.raises(NonFinite, match="validation embeddings are not finite"):
        m(MeanColour(), _val(runs, Colours(12), MeanColour(broken=True)))
    with pytest.raises(NonFinite, match="bank's embeddings are not finite"):
        m(MeanColour(broken=True), _val(runs, Colours(12), MeanColour()))


def test_the_sink_tasks_have_no_monitors(runs: Path) -> None:
    cfg = tiny_cfg(runs, "data=sinktask_nop", "objective=supervised", "model.patch_embed=orthonormal")
    objective = build_objective(cfg, Runtime(CPU))
    objective.watch(Colours(4), 0)
    assert objective.val_view() is None and objective.monitors is None  # per-patch targets: no labelled images


def _by_hand(backbone: nn.Module, cfg, train: Dataset, val: Dataset) -> tuple[float, float]:
    """The monitors image by image: the bank's images and the validation images picked, viewed and embedded one at
    a time, the k-NN by brute force, RankMe of the stacked embeddings."""
    tf = selection_transform(cfg.views.global_size, cfg.selection)
    def one(split: Dataset, i: int) -> tuple[np.ndarray, int]:
        img, label = split[i]
        with torch.no_grad():
            return backbone(tf(img)[None])[0].double().numpy(), label
    bank = [one(train, i) for i in permutation(len(train), cfg.selection.seed)[:cfg.monitors.knn_bank]]
    queries = [one(val, i) for i in permutation(len(val), cfg.selection.seed)]
    pred = _brute_force_knn(np.stack([f for f, _ in queries]), np.stack([f for f, _ in bank]),
                            np.array([y for _, y in bank]), cfg.data.num_classes, cfg.monitors.knn_k,
                            cfg.monitors.knn_temperature)
    top1 = float(np.mean([p == y for p, (_, y) in zip(pred, queries, strict=True)]))
    return top1, rankme(torch.tensor(np.stack([f for f, _ in queries])))


def _setup(runs: Path, world: int = 1):
    cfg = tiny_cfg(runs, "data.val_size=37", "monitors.knn_bank=48", "monitors.knn_k=10")
    objective = build_objective(cfg, Runtime(CPU, world=world))
    torch.manual_seed(0)
    model = objective.setup_model(model_from_config(cfg.model), cfg.data.num_classes)
    train, val = build_dataset(cfg.data, "train", cfg.seed), build_dataset(cfg.data, "val", cfg.seed)
    objective.watch(train, cfg.data.num_classes)
    return cfg, objective, model, train, val


@pytest.mark.parametrize("name", ["lejepa", "supervised"])
def test_a_validation_logs_the_monitors_of_its_bank_and_images_as_computed_by_hand(runs: Path, name: str) -> None:
    cfg, objective, model, train, val = _setup(runs / name)
    if name == "supervised":
        cfg = tiny_cfg(runs / name, "data.val_size=37", "monitors.knn_bank=48", "monitors.knn_k=10",
                       "objective=supervised")
        objective = build_objective(cfg, Runtime(CPU))
        torch.manual_seed(0)
        model = objective.setup_model(model_from_config(cfg.model), cfg.data.num_classes)
        objective.watch(train, cfg.data.num_classes)
    got = objective.validate(model, val)
    model.eval()
    top1, rank = _by_hand(model.backbone, cfg, train, val)
    assert got[KNN] == pytest.approx(top1) and 0 < got[KNN] < 1  # not a trivial answer
    assert got[RANKME] == pytest.approx(rank, rel=1e-5) and 1 < got[RANKME] < 48
    assert objective.validate(model, val) == got  # the same weights: the same numbers (the bank kept, not redrawn)


def _sharded_worker(rank: int, world: int, report, runs: str) -> None:
    cfg, objective, model, train, val = _setup(Path(runs), world)
    assert rank_world() == (rank, world)
    sharded = objective.validate(model, val)  # a collective: each rank embeds its half of the images and the bank
    top1, rank_me = _by_hand(model.backbone, cfg, train, val)
    report(f"{sharded[KNN] == pytest.approx(top1)} {sharded[RANKME] == pytest.approx(rank_me, rel=1e-5)}")


@pytest.mark.slow
def test_two_ranks_get_the_one_process_monitors(tmp_path: Path) -> None:
    reports = run_ranks(_sharded_worker, str(tmp_path))
    assert sorted(what for _, what in reports if what[0] in "TF") == ["True True", "True True"]
