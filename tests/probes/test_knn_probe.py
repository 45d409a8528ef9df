"""The k-NN probe (`vitsinks.probes.knn_probe`, `eval.knn`): DINO's weighted vote against a float64 hand computation
and on planted features whose answer is known, its protocol registry, and `eval.linear` writing `results/knn.json`
from the features it cached once, read by the leaderboard's own column."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.tiny import eval_cfg, tiny_cfg, trained
from vitsinks.leaderboard import leaderboard_command
from vitsinks.probes.knn_probe import knn_predictions, knn_scores
from vitsinks.probes.knn_protocols import DEFAULT_KNN, FEATURES, KNN_PROTOCOLS, KnnProtocol, knn_kind
from vitsinks.probes.probe_results import KnnResult, knn_column
from vitsinks.run import probing
from vitsinks.utils import files
from vitsinks.utils.errors import ConfigError
from vitsinks.utils.results import RESULTS
from vitsinks.utils.rundir import RunDir


def cached(x: np.ndarray, y: np.ndarray, patch_mean: np.ndarray | None = None) -> dict[str, torch.Tensor]:
    """Features as the linear probe caches them (fp16; `cls` of 2 last blocks, the last one the k-NN's)."""
    cls = torch.from_numpy(np.stack([np.zeros_like(x), x], axis=1))
    pm = torch.from_numpy(np.zeros_like(x) if patch_mean is None else patch_mean)
    return {"cls": cls.half(), "patch_mean": pm.half(), "label": torch.from_numpy(y).long()}


def hand_knn(bank: np.ndarray, bank_y: np.ndarray, queries: np.ndarray, classes: int, k: int, t: float) -> np.ndarray:
    """DINO's weighted k-NN in float64, written out: the classes of each query by their summed weight, best first."""
    bank = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    scores = np.zeros((len(queries), classes))
    for i, q in enumerate(queries):
        sim = bank @ (q / np.linalg.norm(q))
        for j in np.argsort(-sim, kind="stable")[: min(k, len(bank))]:
            scores[i, bank_y[j]] += math.exp(sim[j] / t)
    return np.argsort(-scores, axis=1, kind="stable")


def test_the_vote_is_dinos_weighted_knn_computed_by_hand_in_float64() -> None:
    rng = np.random.default_rng(0)
    classes, dim = 6, 12
    centres = rng.normal(size=(classes, dim))
    train_y, val_y = rng.integers(classes, size=260), rng.integers(classes, size=40)
    train = cached((centres[train_y] + 1.5 * rng.normal(size=(260, dim))).astype(np.float32), train_y)
    val = cached((centres[val_y] + 1.5 * rng.normal(size=(40, dim))).astype(np.float32), val_y)
    dino = KNN_PROTOCOLS[DEFAULT_KNN]
    got = knn_predictions(train, val, classes, dino, top=5)
    scores = {s["k"]: s for s in knn_scores(train, val, classes, dino)}
    assert list(got) == [10, 20, 100, 200] and list(scores) == [10, 20, 100, 200]
    bank, queries = train["cls"][:, -1].double().numpy(), val["cls"][:, -1].double().numpy()  # the fp16 values
    for k in dino.ks:
        want = hand_knn(bank, train_y, queries, classes, k, 0.07)[:, :5]
        assert np.array_equal(got[k].numpy(), want), k
        assert scores[k]["top1"] == pytest.approx(100 * np.mean(want[:, 0] == val_y))
        assert scores[k]["top5"] == pytest.approx(100 * np.mean((want == val_y[:, None]).any(1)))
    assert not torch.equal(got[10], got[200])  # each k is its own vote


def circle(*degrees: float) -> np.ndarray:
    """Unit vectors at these angles (n, 2), float32."""
    rad = np.deg2rad(degrees)
    return np.stack([np.cos(rad), np.sin(rad)], 1).astype(np.float32)


def test_planted_neighbours_give_the_known_answer_of_each_setting() -> None:
    """A query at 10 degrees; class 0: one point at 0 degrees, 5 times longer than the rest (cosine ignores length,
    a Euclidean neighbour would not); class 1: points at 40 and -20 degrees, both farther. The closest vote wins at
    T = 0.07 (e^(cos 10 / 0.07) > 2 e^(cos 30 / 0.07)); at T = 1 the two farther ones outweigh it; with k = 1 the
    closest alone votes. The mean patch tokens are planted the other way round: their nearest is class 1."""
    bank, labels, patches = circle(0, 40, -20), np.array([0, 1, 1]), circle(90, 10, 200)
    bank[0] *= 5
    train, val = cached(bank, labels, patches), cached(circle(10), np.array([0]), circle(10))

    def vote(**settings: object) -> dict[int, int]:
        proto = KnnProtocol("planted", "planted", **settings)  # type: ignore[arg-type]
        return {k: int(ranked[0, 0]) for k, ranked in knn_predictions(train, val, 2, proto).items()}

    assert vote(ks=(1, 3), k=3, temperature=0.07) == {1: 0, 3: 0}
    assert vote(ks=(1, 3), k=3, temperature=1.0) == {1: 0, 3: 1}
    assert vote(ks=(3, 50), k=3, temperature=1.0) == {3: 1, 50: 1}  # k beyond the bank: all three vote
    assert vote(ks=(1,), k=1, feature="avgpool") == {1: 1}
    both = hand_knn(np.concatenate([bank, patches], 1), labels, np.concatenate([circle(10)] * 2, 1), 2, 1, 0.07)
    assert vote(ks=(1,), k=1, feature="cls+avgpool") == {1: int(both[0, 0])}
    assert set(FEATURES) == {"cls", "avgpool", "cls+avgpool"}


def test_the_registry_holds_dinos_protocol_and_refuses_a_broken_one() -> None:
    dino = KNN_PROTOCOLS[DEFAULT_KNN]
    assert (DEFAULT_KNN, dino.ks, dino.k, dino.temperature, dino.feature) == ("dino", (10, 20, 100, 200), 20, 0.07,
                                                                              "cls")
    assert knn_kind("dino") == "knn" and knn_kind("mine") == "knn_mine"
    for bad, said in [({"k": 7}, "k=7 must be one of ks"), ({"feature": "patch"}, "feature must be one of"),
                      ({"temperature": 0.0}, "temperature must be > 0"), ({"ks": (5, 5), "k": 5}, "distinct")]:
        with pytest.raises(ValueError, match=said):
            KnnProtocol("bad", "bad", **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="eval.knn_protocol=nope is no registered k-NN probe protocol: choose one "
                                          "of dino; a new one is a `KnnProtocol` registered with"):
        tiny_cfg(Path("unused"), "eval.knn_protocol=nope")
    assert RESULTS["knn"] is KnnResult and [c.key for c in KnnResult.columns()] == ["knn_probe_top1"]
    assert knn_column("dino").probe == dino.label and knn_column("dino").key != "knn_top1"  # not the monitor's


def test_eval_linear_writes_knn_json_from_the_features_it_cached_and_the_leaderboard_shows_it(
        runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt, results = trained(runs, "kn"), runs / "kn" / "results"
    forwards: list[int] = []
    real = probing.global_features
    monkeypatch.setattr(probing, "global_features", lambda m, x, n: forwards.append(len(x)) or real(m, x, n))
    probing.linear_probe(eval_cfg(runs, ckpt))
    assert forwards == [32, 8]  # one pass over each split's images (32 train, 8 val): the k-NN read the cache
    got = json.loads((results / "knn.json").read_text())
    assert (got["protocol"], got["feature"], got["temperature"], got["k"]) == ("dino", "cls", 0.07, 20)
    assert [s["k"] for s in got["by_k"]] == [10, 20, 100, 200] and got["train_images"] == 32
    assert [s.get("neighbours") for s in got["by_k"]] == [None, None, 32, 32]  # k beyond the 32 training images
    assert got["top1"] == next(s["top1"] for s in got["by_k"] if s["k"] == 20)
    # the headline from the cached features by hand: the last block's [CLS], k = 20, T = 0.07
    caches = [files.read_torch(p, "") for p in sorted((runs / "kn" / "eval_cache").glob("lin-*.pt"))]
    train, val = sorted(caches, key=lambda c: -len(c["label"]))
    want = hand_knn(train["cls"][:, -1].double().numpy(), train["label"].numpy(), val["cls"][:, -1].double().numpy(),
                    4, 20, 0.07)
    assert got["top1"] == pytest.approx(100 * np.mean(want[:, 0] == val["label"].numpy()))
    assert KnnResult.from_json(got).to_json() == got

    assert leaderboard_command([f"runs={runs}", f"out={runs / 'board'}"]) == 0
    header, row = (runs / "board" / "runs.csv").read_text().splitlines()[:2]
    assert float(dict(zip(header.split(","), row.split(","), strict=True))["knn_probe_top1"]) == pytest.approx(
        got["top1"])
    assert "k-NN probe top-1 (k=20)" in (runs / "board" / "leaderboard.md").read_text()
    assert KnnResult.probed(RunDir(runs / "kn"))["knn_probe_top1"].checkpoint == "last.pt"

    with_knn = (results / "linear.json").read_text()
    for name in ("linear.json", "knn.json"):
        (results / name).unlink()
    probing.linear_probe(eval_cfg(runs, ckpt, "eval.knn=false"))
    assert (results / "linear.json").read_text() == with_knn  # the linear probe is the same with the k-NN or without
    assert not (results / "knn.json").exists() and forwards == [32, 8]  # off: no k-NN; the features from the cache
