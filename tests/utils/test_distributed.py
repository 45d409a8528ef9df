"""Device resolution: the one function that turns `cluster.device` into a device."""

from __future__ import annotations

import pytest
import torch

from vitsinks.utils.distributed import resolve_device


def test_auto_and_named_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="cluster.device=cuda but CUDA is not available"):
        resolve_device("cuda")


def test_auto_picks_this_ranks_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("auto") == torch.device("cuda", 3) and chosen == [3]
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1) and chosen == [3, 1]
