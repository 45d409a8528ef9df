"""W8A8 and the test-time register through the transformers views (DINOv2), held against transformers' own forward:
the quantised weights and inputs on grids recomputed from the float model, and a zero register equal to a
`Dinov2WithRegistersModel` with one zero register token and the same weights."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.neuron_tables import assert_table_equals, outlier_patches, summary_rows, unit_scores
from tests.helpers.requirements import require
from tests.helpers.transformers_models import REGISTERS, SMALL, build, images
from vitsinks.pretrained import adapt, diagnose
from vitsinks.pretrained.edit_calls import (
    add_test_time_register,
    apply_massive,
    apply_w8a8,
    fit_massive,
    fit_w8a8,
    register_neurons,
)
from vitsinks.quant.outliers import layer_paths
from vitsinks.utils.errors import BadValue

T = require("transformers")


def on_grid(t: torch.Tensor, scale: float) -> bool:
    """Every entry of `t` an integer multiple of `scale` within [-127, 127] levels."""
    q = t.double() / scale
    return bool((q - q.round()).abs().max() < 1e-3 and q.abs().max() <= 127 + 1e-3)


@torch.no_grad()
def test_w8a8_on_dinov2_puts_weights_and_inputs_on_their_grids() -> None:
    m = build("dinov2_reg")
    x, calib = images(2), images(4)
    linears = {n: mod for n, mod in m.named_modules() if isinstance(mod, nn.Linear) and n.startswith("encoder.")}
    weights = {n: mod.weight.clone() for n, mod in linears.items()}
    top = dict.fromkeys(linears, 0.0)  # max |input| under transformers' own forward of the float model
    hooks = [mod.register_forward_pre_hook(lambda _m, a, n=n: top.__setitem__(n, max(top[n], a[0].abs().max().item())))
             for n, mod in linears.items()]
    m(pixel_values=calib)
    for h in hooks:
        h.remove()
    state = fit_w8a8(m, calib)
    assert len(state["layers"]) == len(linears) == 6 * SMALL["num_hidden_layers"]  # q, k, v, o, fc1, fc2
    torch.testing.assert_close(state["act_max"], torch.tensor(list(top.values()), dtype=torch.float64), rtol=1e-6,
                               atol=0)
    apply_w8a8(m, state)
    seen: dict[str, torch.Tensor] = {}
    for n, mod in linears.items():  # after the quantising hook: what the layer computes with
        assert on_grid(mod.weight, weights[n].abs().max().item() / 127)
        mod.register_forward_pre_hook(lambda _m, a, n=n: seen.__setitem__(n, a[0]))
    m(pixel_values=x)
    assert all(on_grid(seen[n], top[n] / 127) for n in linears)
    assert list(layer_paths(adapt(m))) == [f"blocks.{n.split('.', 2)[2]}" for n in linears]


@torch.no_grad()
def test_zero_register_equals_dinov2_with_one_more_register() -> None:
    plain = build("dinov2")
    cfg = {k: v for k, v in plain.config.to_dict().items() if k in T.Dinov2WithRegistersConfig().to_dict()}
    twin = T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(**{**cfg, "num_register_tokens": 1})).eval()
    missing, unexpected = twin.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["embeddings.register_tokens"] and not unexpected
    twin.embeddings.register_tokens.zero_()
    x = images(3)
    f = add_test_time_register(plain)
    assert (f.num_cls, f.num_registers) == (1, 1)
    torch.testing.assert_close(f.forward_features(x),
                               twin(pixel_values=x).last_hidden_state, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_register_neurons_moved_onto_the_test_time_register() -> None:
    m = build("dinov2_reg")
    x = images(3)
    mlp = m.encoder.layer[1].mlp
    before, after = {}, {}
    mlp.activation_fn.register_forward_hook(lambda _m, _a, out: before.__setitem__("a", out.clone()))
    mlp.fc2.register_forward_pre_hook(lambda _m, a: after.__setitem__("a", a[0]))
    units, reg = [1, 6], 1 + REGISTERS  # the new register: after [CLS] and the model's registers
    f = add_test_time_register(m, [(1, u) for u in units])
    f.forward_features(x)
    a, b = before["a"], after["a"]
    assert a.shape[1] == 1 + REGISTERS + 1 + 16
    torch.testing.assert_close(b[:, reg, units], a[:, :, units].amax(1))
    assert (b[:, reg + 1 :, units] == 0).all()
    others = [u for u in range(a.shape[-1]) if u not in units]
    assert torch.equal(b[:, :, others], a[:, :, others]) and torch.equal(b[:, :reg, units], a[:, :reg, units])
    t = diagnose(f, x)
    assert t["layout"]["num_registers"][0] == REGISTERS + 1 and t["checks"]["recompute_error"].max() < 1e-4
    with pytest.raises(BadValue, match="cannot run without its registers"):
        m(pixel_values=x)  # the model's own forward has no test-time register: the hooks refuse it


def own_forward(m: nn.Module, x: torch.Tensor) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every layer's MLP activations (hooked) and output (`hidden_states`, before the final norm) under
    transformers' own forward, in float64."""
    acts: dict[int, np.ndarray] = {}

    def keep(b: int) -> Callable[..., None]:
        return lambda _m, _i, out: acts.__setitem__(b, out.double().numpy())

    hooks = [layer.mlp.activation_fn.register_forward_hook(keep(b)) for b, layer in enumerate(m.encoder.layer)]
    hidden = m(pixel_values=x, output_hidden_states=True).hidden_states[1:]
    for h in hooks:
        h.remove()
    return [acts[b] for b in range(len(acts))], [h.double().numpy() for h in hidden]


@torch.no_grad()
def test_register_neurons_equal_a_recomputation_from_transformers_forward() -> None:
    """The ranking recomputed in numpy from transformers' own forward: hidden states and hooked activations."""
    m = build("dinov2_reg")
    x, k, prefix = images(4), 1.05, 1 + REGISTERS
    acts, outs = own_forward(m, x)
    mask = outlier_patches(outs[-1], k, prefix)
    scores = {(b, u): s for b, a in enumerate(acts) for u, s in enumerate(unit_scores(a, mask))}
    want = sorted(scores.items(), key=lambda kv: -kv[1])[:8]
    got = register_neurons(m, x, top=8, k=k)
    assert [(b, u) for b, u, _ in got] == [bu for bu, _ in want]
    np.testing.assert_allclose([s for *_, s in got], [s for _, s in want], rtol=1e-5)


@torch.no_grad()
def test_neuron_summary_equals_a_recomputation_from_transformers_forward() -> None:
    """`diagnose(..., neurons=k)`'s table (`summarize_neurons` through the views) equals the summary recomputed in
    numpy from transformers' own forward (the layer scale `lambda2` in the share)."""
    m = build("dinov2_reg")
    x, k = images(4), 1.05
    acts, outs = own_forward(m, x)
    layers = m.encoder.layer
    want = summary_rows(acts, outs, [la.mlp.fc2.weight.double().numpy() for la in layers],
                        [la.layer_scale2.lambda1.double().numpy() for la in layers], k, 1 + REGISTERS, 10)
    assert_table_equals(diagnose(m, x, neurons=k)["neurons"], want)
    last = diagnose(m, x, blocks=[-1], neurons=k)["neurons"]
    assert set(last["block"]) == {len(layers) - 1}  # the chosen blocks' rows only


@torch.no_grad()
def test_massive_fix_sets_the_layer_output_under_transformers_forward() -> None:
    """After the edit, transformers' own forward puts the fitted mean at each channel's massive token of the massive
    layer's output (its hidden state), the other tokens and channels of that layer as before."""
    m = build("dinov2_reg")
    x = images(3)
    state = fit_massive(m, images(4), massive=2)
    b, ch = state["block"], state["channels"]
    h0 = m(pixel_values=x, output_hidden_states=True).hidden_states[b + 1].double()
    token = h0[:, :, ch].abs().argmax(1)  # (B, K) each channel's massive token before the edit
    apply_massive(m, state)
    h1 = m(pixel_values=x, output_hidden_states=True).hidden_states[b + 1].double()
    rows = torch.arange(len(x))[:, None]
    torch.testing.assert_close(h1[rows, token, torch.tensor(ch)[None]],
                               torch.tensor(state["means"], dtype=torch.float64).expand(len(x), -1), rtol=1e-5,
                               atol=1e-5)
    changed = (h1 - h0).abs() > 1e-5 * h0.abs().max()
    edited = torch.zeros_like(changed)
    edited[rows, token, torch.tensor(ch)[None]] = True
    assert not (changed & ~edited).any() and changed.any()  # only those entries (one may already hold its mean)
    assert diagnose(m, x)["checks"]["recompute_error"].max() < 1e-4
