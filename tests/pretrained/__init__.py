"""Tests of vitsinks.pretrained. The optional libraries (the `hf` and `clip` extras) skip their tests when missing,
except under CI (CI=true), which installs them: there a missing one fails (`require`)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import numpy as np
import pytest
import torch

from vitsinks.diagnostics.core import diagnose_tokens
from vitsinks.diagnostics.fields import FIELDS
from vitsinks.models import SinkViT
from vitsinks.pretrained.views import Foreign

COMPARED = (*FIELDS[1:], "prefix_mass", "cm_num", "cm_den", "token_norm_max", "massive_ratio")


def require(module: str) -> ModuleType:
    """`module` imported; missing: a skip, or under CI=true a failure (CI installs the extras)."""
    if os.environ.get("CI", "").lower() == "true":
        try:
            return importlib.import_module(module)
        except ImportError as e:
            pytest.fail(f"{module} is missing ({e}); CI installs the extras: pip install -e '.[dev,hf,clip]'",
                        pytrace=False)
    return pytest.importorskip(module)


def assert_fields_equal_own(foreign: Foreign, own: SinkViT, x: torch.Tensor) -> None:
    """The views' tokens entering block 0 and every diagnostics field of `x` equal vitsinks' own ViT on the same
    weights converted (`own`): sink indices exactly, the rest (`COMPARED`, and every per-head field of `own`'s, a
    mitigation's such as `gate_mean` included) to 1e-4; the views rebuild every block within the recomputation
    tolerance."""
    t_foreign, t_own = foreign.embed(x), own.embed_tokens(x)
    torch.testing.assert_close(t_foreign, t_own, rtol=1e-6, atol=1e-6)
    got = diagnose_tokens(foreign.blocks, t_foreign, num_prefix=foreign.num_prefix)
    want = diagnose_tokens(own.blocks, t_own, num_prefix=own.num_prefix_tokens)
    assert got["recompute_error"].max() < 1e-4
    np.testing.assert_array_equal(got["sink_idx"], want["sink_idx"])
    per_head = [k for k, v in want.items() if v.shape == want["sink_idx"].shape and k not in (*COMPARED, "sink_idx")]
    for k in (*COMPARED, *per_head):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4, err_msg=k)
