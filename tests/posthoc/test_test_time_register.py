"""Test-time register: the planted register neuron's artifact leaves the patch for the extra prefix token, and the
edited model is a model with one more register for every analysis."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from timm.layers import GluMlp

from tests.helpers.register_neuron import PATCH, UNIT, last_norms, plant_register_neuron
from tests.helpers.tiny import images, tiny_vit
from vitsinks.backbones import adapt
from vitsinks.backbones.native import add_register
from vitsinks.configs.schema import TrainFreeConfig
from vitsinks.diagnostics import diagnose
from vitsinks.posthoc import method
from vitsinks.posthoc.test_time_register import TestTimeRegister, move_to_register
from vitsinks.probes.features import global_features, patch_features
from vitsinks.utils.errors import BadValue


@pytest.mark.parametrize("neurons", [1, 10])
def test_the_artifact_moves_from_the_patch_to_the_test_time_register(neurons: int) -> None:
    torch.manual_seed(0)
    x = images()
    model = plant_register_neuron(tiny_vit(depth=3), x)
    base = copy.deepcopy(model)
    state = TestTimeRegister.fit(adapt(model), x, TrainFreeConfig(neurons=neurons))
    assert state["neurons"][0] == [1, UNIT] and len(state["neurons"]) == neurons
    assert model.variant == "base"
    edited = method("test_time_register").apply(adapt(model), state).model
    assert (edited.num_reg_tokens, edited.num_prefix_tokens, tuple(edited.reg_token.shape)) == (1, 2, (1, 1, 48))
    assert edited.variant == "base + test-time register"  # named as its leaderboard row, not as a trained reg1
    before, after = last_norms(base, x), last_norms(edited, x)
    assert after.shape[1] == before.shape[1] + 1
    ratio = after / after.median(dim=-1, keepdim=True).values
    assert (before[:, 1 + PATCH] / before.median(dim=-1).values > 20).all()
    assert (ratio[:, 2 + PATCH] < 2).all()  # the planted patch (one token later now) is an ordinary token
    assert (ratio[:, 1] > 20).all()  # the test-time register holds the artifact
    assert (ratio[:, 2:] < 5).all()  # no patch is high-norm
    d = diagnose(edited, x)  # the explicit recomputation sees the same hooks (it raises otherwise)
    assert int(d["num_registers"]) == 1 and int(d["num_prefix"]) == 2 and d["mass"].shape == (8, 3, 3)
    assert d["recompute_error"].max() < 1e-4
    assert patch_features(edited, x).shape == patch_features(base, x).shape == (8, 48, 4, 4)
    cls, mean_patch = global_features(edited, x, 1)
    assert cls.shape == (8, 1, 48) and mean_patch.shape == (8, 48)


@pytest.mark.parametrize("registers,register_pos_embed", [(0, False), (2, False), (2, True)])
def test_the_extra_token_is_zero_without_position_and_patches_are_unchanged(registers: int,
                                                                           register_pos_embed: bool) -> None:
    torch.manual_seed(0)
    model = tiny_vit(registers=registers, register_pos_embed=register_pos_embed).eval()
    x = images(2)
    with torch.no_grad():
        before = model.embed_tokens(x)
        index = model.num_prefix_tokens
        add_register(model, "test-time register")
        after = model.embed_tokens(x)
    assert index == 1 + registers and model.num_prefix_tokens == 2 + registers
    assert after.shape[1] == before.shape[1] + 1
    torch.testing.assert_close(after[:, :index], before[:, :index], rtol=0, atol=0)  # [CLS] and trained registers
    assert after[:, index].abs().max() == 0  # the new register: zero, no position embedding
    torch.testing.assert_close(after[:, index + 1 :], before[:, index:], rtol=0, atol=0)  # the patches
    cls, reg, patches = model.prefix_and_patches(after)
    assert reg.shape[1] == registers + 1 and patches.shape[1] == 16
    assert model.forward_features(x).shape == (2, 18 + registers, 48)


def test_the_hook_moves_each_units_peak_to_the_register_and_zeroes_the_patches() -> None:
    out = torch.tensor([[[1.0, 5.0, 2.0], [0.5, 1.0, 7.0], [3.0, 9.0, 1.0], [4.0, 2.0, 8.0]]])  # (1, N=4, H=3)
    got = move_to_register([1, 2], register=1, first_patch=2)(None, None, out)
    want = torch.tensor([[[1.0, 5.0, 2.0], [0.5, 9.0, 8.0], [3.0, 0.0, 0.0], [4.0, 0.0, 0.0]]])
    torch.testing.assert_close(got, want)
    assert out[0, 2, 1] == 9.0  # the module's own output is not overwritten in place


def test_a_state_of_another_architecture_is_refused() -> None:
    with pytest.raises(BadValue, match="not in this 2-block model"):
        TestTimeRegister.apply(adapt(tiny_vit()), {"neurons": [[5, 0]], "scores": [1.0], "k": 5.0})
    with pytest.raises(BadValue, match="not in this"):
        TestTimeRegister.apply(adapt(tiny_vit(mlp=False)), {"neurons": [[0, 0]], "scores": [1.0], "k": 5.0})


def test_without_its_registers_the_edited_model_refuses_to_run_and_at_another_size_it_follows() -> None:
    torch.manual_seed(0)
    x = images(4)
    model = plant_register_neuron(tiny_vit(depth=3), x)
    subject = TestTimeRegister.apply(adapt(model), TestTimeRegister.fit(adapt(model), x, TrainFreeConfig(neurons=1)))
    edited = subject.model  # the backbone as the interventions run it: drop_registers runs the blocks without them
    with torch.no_grad():
        tokens = subject.embed(x)
        assert subject.run(tokens).shape == (4, 2 + 16, 48)
        with pytest.raises(BadValue, match="cannot run without its registers .* choose other edits"):
            subject.run(subject.without_registers(tokens))
    seen = {}  # 48 px images (36 patches, dynamic_img_size): the register and the patches are found again
    act = edited.blocks[1].mlp.act
    act.register_forward_pre_hook(lambda _m, args: seen.update(z=args[0][..., UNIT].clone()))
    act.register_forward_hook(lambda _m, _i, out: seen.update(a=out[..., UNIT].clone()))  # after the edit's hook
    big = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert edited.forward_features(big).shape == (2, 2 + 36, 48)
    torch.testing.assert_close(seen["a"][:, 1], F.gelu(seen["z"]).amax(dim=1))  # the peak over all tokens
    assert (seen["a"][:, 2:] == 0).all()  # every patch zeroed
    torch.testing.assert_close(seen["a"][:, 0], F.gelu(seen["z"][:, 0]))  # [CLS] keeps its own


def test_a_gated_mlp_has_no_register_neurons_to_move() -> None:
    model = tiny_vit(depth=2)
    model.blocks[1].mlp = GluMlp(48, 96)  # its act is only the gate of fc1's second half
    with pytest.raises(BadValue, match="block 1 has GluMlp"):
        TestTimeRegister.fit(adapt(model), images(2), TrainFreeConfig())
