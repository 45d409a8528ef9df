"""The models benchmark's activation memory against a hand count."""

from __future__ import annotations

import torch

from vitsinks.benchmarks.models import activation_mib


def test_activation_memory_counts_what_autograd_keeps_and_leaves_the_parameters_out() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU())
    x = torch.randn(7, 10)

    def step() -> None:
        model(x).sum().backward()

    # by hand: the linear layer keeps its input (7 x 10) for the weight's gradient (the weight itself is a
    # parameter), ReLU keeps its output (7 x 20); float32
    assert activation_mib(step, model) == 7 * (10 + 20) * 4 / 2**20
    assert model[0].weight.grad is not None  # the step ran, backward included
