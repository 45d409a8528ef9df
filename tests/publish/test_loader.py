"""`vitsinks.pretrained.load("vitsinks:<folder>")`: the `Loaded` form of an exported folder, whose preprocessing is the
run's analysis view; a folder that is no export, or a name that is neither a folder nor a hub id, is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.exported_runs import make_run
from tests.helpers.tiny import TINY, tiny_cfg
from vitsinks import pretrained
from vitsinks.data.selection import analysis_transform
from vitsinks.diagnose import cli as diagnose_cli
from vitsinks.publish.folder import write_folder
from vitsinks.utils.errors import BadValue


def test_the_loaded_form_has_the_runs_analysis_view(runs: Path, tmp_path: Path) -> None:
    run = make_run(runs, "reg", "exp=reg")
    out = write_folder(tiny_cfg(runs, f"ckpt={run.last}", f"export.out={tmp_path / 'out'}"))[0]
    loaded = pretrained.load(f"vitsinks:{out}")
    assert loaded.spec == f"vitsinks:{out.resolve()}"
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8))
    x = loaded.images([picture])
    assert torch.equal(x[0], analysis_transform(32)(picture))  # the run's own analysis view (32 px, crop 0.875)
    assert loaded.mean == tuple(json.loads((out / "config.json").read_text())["pretrained_cfg"]["mean"])
    assert loaded.model.forward_features(x).shape == (1, 1 + 4 + 16, 48)


def test_what_is_no_export_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(BadValue, match="no such folder; name an exported folder"):
        pretrained.load(f"vitsinks:{tmp_path / 'missing' / 'deeper'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadValue, match="holds no config.json and model.safetensors"):
        pretrained.load(f"vitsinks:{tmp_path / 'empty'}")
    timm_folder = tmp_path / "timm"
    timm_folder.mkdir()
    (timm_folder / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224"}))
    (timm_folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(BadValue, match="not a vitsinks export .*local-dir"):
        pretrained.load(f"vitsinks:{timm_folder}")
    with pytest.raises(BadValue, match="no @"):
        pretrained.load(f"vitsinks:{timm_folder}@weights.pt")


def test_diagnose_reads_an_exported_folder_by_hub(runs: Path, tmp_path: Path) -> None:
    run = make_run(runs, "gr", "exp=gate+reg")
    out = write_folder(tiny_cfg(runs, f"ckpt={run.last}", f"export.out={tmp_path / 'gr'}"))[0]
    diagnose_cli([*TINY, f"runs_dir={runs}", f"hub=vitsinks:{out}", "n_images=2", "diagnostics.plots=false",
                  "diagnostics.report=false"])
    summary = json.loads((runs / "diagnostics" / "vitsinks_gr" / "summary.json").read_text())
    assert summary["shape"] == {"images": 2, "blocks": 2, "heads": 3, "registers": 4}
    assert len(summary["gate_mean_by_block"]) == 2  # vitsinks' own gated model, read back from the folder
