"""The outlier statistics of the blocks' linear-layer inputs, against a float64 recomputation on the same inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import vitsinks.quant  # noqa: F401 - the package as the commands import it
from tests.helpers.tiny import tiny_vit
from vitsinks.backbones import adapt
from vitsinks.quant.outliers import block_layers, layer_key, linear_input_stats, pearson_kurtosis, stat_max
from vitsinks.utils.errors import NonFinite


def _captured(model: torch.nn.Module, images: torch.Tensor) -> dict[str, list[np.ndarray]]:
    """Every block linear layer's input per batch, captured by hooks of this test's own."""
    seen: dict[str, list[np.ndarray]] = {}
    handles = []
    for i, blk in enumerate(model.blocks):
        for name, mod in blk.named_modules():
            if isinstance(mod, torch.nn.Linear):
                key = f"{i}:{name}"
                handles.append(mod.register_forward_pre_hook(
                    lambda _m, args, key=key: seen.setdefault(key, []).append(args[0].double().numpy())))
    with torch.no_grad():
        for lo in range(0, len(images), 3):
            model.forward_features(images[lo : lo + 3])
    for h in handles:
        h.remove()
    return seen


def _kurtosis64(x: np.ndarray) -> float:
    """Pearson kurtosis of all entries, float64, written out: m4 / m2^2 (population moments)."""
    d = x.ravel() - x.mean()
    return float(np.mean(d**4) / np.mean(d**2) ** 2)


def test_kurtosis_and_inf_norm_match_a_float64_recomputation_on_the_captured_inputs() -> None:
    torch.manual_seed(0)
    model = tiny_vit(gate="elementwise").eval()
    images = torch.randn(7, 3, 32, 32)
    stats = linear_input_stats(adapt(model), images, batch_size=3)  # batches of 3, 3, 1: the sums do not depend on it
    seen = _captured(model, images)
    assert set(stats["kurtosis"]) == {"qkv", "proj", "fc1", "fc2", "gate"}  # the gate's linear too
    for i in range(len(model.blocks)):
        for name in ("attn.qkv", "attn.proj", "attn.gate", "mlp.fc1", "mlp.fc2"):
            per_image = np.concatenate(seen[f"{i}:{name}"])  # (7, N, C)
            want_k = np.mean([_kurtosis64(x) for x in per_image])
            assert stats["kurtosis"][layer_key(name)][i] == pytest.approx(want_k, rel=1e-9)
            assert stats["inf_norm"][layer_key(name)][i] == pytest.approx(float(np.abs(per_image).max()), rel=1e-6)
    assert stat_max(stats, "inf_norm") == max(v for layer in stats["inf_norm"].values() for v in layer)


def test_pearson_kurtosis_known_answers() -> None:
    gen = torch.Generator().manual_seed(1)
    gauss = torch.randn(2, 200_000, generator=gen)
    assert pearson_kurtosis(gauss).tolist() == pytest.approx([3.0, 3.0], abs=0.05)  # Gaussian: 3
    two_point = torch.tensor([[-1.0, 1.0] * 50])
    assert pearson_kurtosis(two_point).item() == pytest.approx(1.0)  # the minimum, a symmetric two-point law
    spike = torch.zeros(1, 1000)
    spike[0, 0] = 1.0  # one outlier among n entries: ((n - 1)^3 + 1) / (n (n - 1)), about n
    n = 1000
    assert pearson_kurtosis(spike).item() == pytest.approx(((n - 1) ** 3 + 1) / (n * (n - 1)), rel=1e-9)


def test_layers_are_keyed_by_their_path_in_the_block() -> None:
    model = tiny_vit(global_pathway={"enabled": True})
    keys = block_layers(adapt(model))[0]
    assert keys["qkv"] == "blocks.0.attn.qkv" and keys["fc2"] == "blocks.0.mlp.fc2"
    assert {k for k in keys if k.startswith("pathway.")} == {"pathway.inp", "pathway.out"}


def test_a_constant_input_has_no_kurtosis_and_is_no_error() -> None:
    """The global pathway with `state_dim=1`: `pathway.out` reads one number per image (constant on each image):
    no kurtosis there (None), every other statistic as usual; the largest kurtosis is over the defined ones."""
    torch.manual_seed(0)
    model = tiny_vit(global_pathway={"enabled": True, "state_dim": 1}).eval()
    images = torch.randn(3, 3, 32, 32)
    stats = linear_input_stats(adapt(model), images)
    assert stats["kurtosis"]["pathway.out"] == [None] * len(model.blocks)
    assert all(v is not None and v > 0 for v in stats["inf_norm"]["pathway.out"])
    seen = _captured(model, images)
    want = np.mean([_kurtosis64(x) for x in np.concatenate(seen["0:pathway.inp"])])
    assert stats["kurtosis"]["pathway.inp"][0] == pytest.approx(want, rel=1e-9)
    defined = [v for k, layer in stats["kurtosis"].items() for v in layer if k != "pathway.out"]
    assert stat_max(stats, "kurtosis") == max(defined)


def test_a_non_finite_input_is_an_error_not_a_statistic() -> None:
    model = tiny_vit().eval()
    with torch.no_grad():
        model.blocks[1].norm2.weight[3] = math.nan
    with pytest.raises(NonFinite, match="blocks.1.mlp.fc1"):
        linear_input_stats(adapt(model), torch.randn(2, 3, 32, 32))
