"""The report pages against real diagnoses of tiny models: a planted sink's map peaks at its patch, the PNG colours
are the JSON's values, every number of the page is the JSON's, the PCA is a function of the features ordered by
variance, and the page renders in headless chromium."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.commands import run_command
from tests.helpers.diagnosed import BLOCK, HEAD, PATCH, QUANT, diagnosed, over_training_page
from tests.helpers.requirements import require_chromium
from vitsinks.backbones import adapt
from vitsinks.diagnostics.page import REPORT, REPORT_JSON, _quant, _quant_html, checkpoint_report, num
from vitsinks.diagnostics.page_figures import ATTN_CMAP, NORM_CMAP, colour, pca_colours, scale_factor
from vitsinks.diagnostics.run_page import run_report
from vitsinks.models import SinkViT
from vitsinks.utils.errors import BadValue, InputNotFound, NonFinite
from vitsinks.utils.rundir import RunDir


def token_norms(model: SinkViT, images: torch.Tensor) -> np.ndarray:
    """(n, L, N): the L2 norm of every residual-stream token after each block, recomputed block by block."""
    with torch.no_grad():
        x, out = model.embed_tokens(images), []
        for blk in model.blocks:
            x = blk(x)
            out.append(x.norm(dim=-1))
    return torch.stack(out, 1).numpy()


class _Page(HTMLParser):
    """The visible text of a page (no style, with the tooltips: `title` attributes) and its images."""

    def __init__(self) -> None:
        super().__init__()
        self.text, self.images, self._skip = [], [], False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._skip = tag == "style"
        self.text += [v for k, v in attrs if k == "title"]
        if tag == "img":
            self.images.append(dict(attrs))

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)


def parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text())
    return p


def decode(uri: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB"))


def leaves(obj: Any, skip: tuple[str, ...] = ("map", "pca_map")) -> list[Any]:
    """The JSON's numbers, the map arrays (shown as colours) left out."""
    if isinstance(obj, dict):
        return [v for k, x in obj.items() if k not in skip for v in leaves(x, skip)]
    if isinstance(obj, list):
        return [v for x in obj for v in leaves(x, skip)]
    return [obj] if isinstance(obj, int | float) and not isinstance(obj, bool) else []


NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[+-]\d+)?")


def test_the_planted_sink_peaks_at_its_patch_and_the_pictures_are_the_json(report: tuple) -> None:
    path, data, (model, images, _, d, summary) = report
    assert summary["strongest_head_by_block"]["head"][BLOCK] == HEAD  # the plant is the block's strongest head
    evr = data["pca"]["explained_variance_ratio"]
    assert evr[0] >= evr[1] >= evr[2] > 0 and sum(evr) <= 1
    page = parse(path)
    for m in data["images"]:
        a = m["attention"][BLOCK]
        grid = np.array(a["map"])
        assert a["head"] == HEAD and np.unravel_index(grid.argmax(), grid.shape) == divmod(PATCH, 4)
        assert grid.max() == a["max"] > 0.9 and a["patches"] == pytest.approx(grid.sum(), abs=1e-5)
        src = next(i["src"] for i in page.images if i["alt"] == f"block {BLOCK} head {HEAD} attention")
        pic = decode(src)
        f = scale_factor(32)
        assert pic.shape == (32 * f, 32 * f, 3)
        # the upscaled PNG is nearest-neighbour: each grid cell is one flat block of the colour of its value
        cells = pic.reshape(4, 8 * f, 4, 8 * f, 3)
        assert (cells == cells[:, :1, :, :1]).all()
        np.testing.assert_array_equal(cells[:, 0, :, 0], colour(grid, *m["attention_scale"], ATTN_CMAP))
        assert m["attention_scale"] == [0.0, max(max(map(max, t["map"])) for t in m["attention"])]
    m, norms = data["images"][0], token_norms(model, images)
    for b, t in enumerate(m["token_norm"]):  # the norms are the residual stream's, and so are their colours
        np.testing.assert_allclose(np.array(t["map"]).ravel(), norms[0, b, 1:], rtol=1e-5)
        assert t["cls"] == pytest.approx(float(norms[0, b, 0]), rel=1e-5)
    pic = decode(next(i["src"] for i in page.images if i["alt"] == "block 0 token norms")).reshape(4, 32, 4, 32, 3)
    t = m["token_norm"][0]
    np.testing.assert_array_equal(pic[:, 0, :, 0], colour(np.array(t["map"]), t["vmin"], t["vmax"], NORM_CMAP))


def test_every_number_on_the_page_is_in_the_json_and_back(report: tuple) -> None:
    path, data, _ = report
    text = " ".join(parse(path).text)
    known, on_page = {num(x) for x in leaves(data)}, set(NUMBER.findall(text))
    assert on_page - known == set()
    assert known - on_page == set()  # and every number of the JSON is on the page (the maps: as colours)
    assert "register neurons: not in this summary" in text and "> 5x: sink share" in text
    assert "norm_hist" not in json.dumps(data)  # not shown, so not in the page's JSON either
    assert data["quant"]["feature_cosine_error"] == pytest.approx(1 - QUANT["feature_cosine"])  # 0.0125, not 0.988
    assert data["quant"]["feature_cosine_error_by_block"] == pytest.approx([1 - c for c in
                                                                           QUANT["feature_cosine_by_block"]])
    assert "1 - cosine of the final features to fp32's: 0.0125" in text


def test_a_quant_result_without_probes_says_so_and_names_the_checkpoint_by_its_run() -> None:
    bare = {**QUANT, "online_top1": None, "dense": {}, "checkpoint": "/abs/folders/runs/a-s0/checkpoints/last.pt"}
    view = _quant(bare)
    assert view["checkpoint"] == "a-s0/checkpoints/last.pt" and "feature_cosine" not in view
    text = _quant_html(view)
    assert "No probe to compare" in text and "quant-top" not in text and "/abs/folders" not in text
    assert "quant-top" in _quant_html(_quant(QUANT))
    assert _quant({**QUANT, "checkpoint": "/abs/folders/weights.pth"})["checkpoint"] == "weights.pth"  # a loose file
    assert _quant({**QUANT, "checkpoint": None})["checkpoint"] == ""


def test_registers_are_prefix_shares_beside_the_grid(tmp_path: Path) -> None:
    model, images, shown, d, summary = diagnosed(registers=2, depth=2, n=2)
    summary = {k: v for k, v in summary.items() if k != "residual"}
    edit = {"method": "mean_massive", "massive": 3, "source": "runs/a/checkpoints/last.pt"}
    checkpoint_report(adapt(model), images, shown, d, summary, tmp_path, n_images=4, trainfree=edit)
    data = json.loads((tmp_path / REPORT_JSON).read_text())
    assert data["model"]["images_shown"] == 2  # only two maps were kept
    for m in data["images"]:
        for b, a in enumerate(m["attention"]):
            col = d["attn_col_mean"][m["image"], b, a["head"]]
            assert len(a["registers"]) == 2 and a["registers"] == pytest.approx(col[1:3].tolist(), abs=1e-6)
            assert np.array(a["map"]).shape == (4, 4)
            assert a["cls"] + sum(a["registers"]) + a["patches"] == pytest.approx(1.0, abs=1e-5)  # softmax rows
    text = " ".join(parse(tmp_path / REPORT).text)
    assert "No residual measures in this summary" in text and "No quantization result" in text
    assert data["trainfree"] == edit and "mean_massive" in text and "runs/a/checkpoints/last.pt" in text
    assert set(NUMBER.findall(text)) == {num(x) for x in leaves(data)}  # registers in the tooltips


def test_pca_colours_are_a_function_of_the_features_ordered_by_variance() -> None:
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(3, 16, 10)) * np.linspace(4, 0.5, 10)  # channel variances 16 .. 0.25
    rgb, evr = pca_colours(feats)
    again, evr2 = pca_colours(feats.copy())
    np.testing.assert_array_equal(rgb, again) and np.testing.assert_array_equal(evr, evr2)
    assert rgb.shape == (3, 16, 3) and rgb.min() == 0.0 and rgb.max() == 1.0
    eig = np.linalg.eigvalsh(np.cov(feats.reshape(-1, 10), rowvar=False))[::-1]  # independent: the covariance
    np.testing.assert_allclose(evr, eig[:3] / eig.sum(), rtol=1e-10)
    assert evr[0] > evr[1] > evr[2]
    perm = rng.permutation(10)  # channel order is not a choice of sign: the same colours
    np.testing.assert_allclose(pca_colours(feats[..., perm])[0], rgb, atol=1e-12)
    flipped, _ = pca_colours(-feats)  # the sign rule is on the loadings (the same for -x): the colours invert
    np.testing.assert_allclose(flipped, 1 - rgb, atol=1e-12)
    with pytest.raises(NonFinite, match="not finite"):
        pca_colours(np.full((1, 4, 3), np.nan))


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    model, images, shown, d, summary = diagnosed(depth=2, n=1)
    with pytest.raises(BadValue, match="keep_maps"):
        checkpoint_report(adapt(model), images, shown, {k: v for k, v in d.items() if k != "attn_col_mean"}, summary,
                          tmp_path)
    with pytest.raises(BadValue, match="uint8 RGB"):
        checkpoint_report(adapt(model), images, shown[..., 0], d, summary, tmp_path)
    with pytest.raises(InputNotFound, match="python -m vitsinks.diagnose run="):
        run_report(RunDir(tmp_path / "empty"))


def test_run_page_over_training_links_the_checkpoint_pages(tmp_path: Path, report: tuple) -> None:
    run = over_training_page(tmp_path, report)
    path = run.diagnostics_root / REPORT
    got = json.loads((run.diagnostics_root / REPORT_JSON).read_text())
    assert [r["step"] for r in got["steps"]] == [100, 200]
    assert got["steps"][1]["sinks_per_image"]["broadcast"] == 2.0 and got["steps"][1]["max_norm"] == 77.5
    assert got["steps"][0]["max_norm"] is None and got["steps"][1]["top_activation_ratio"] == 100.8
    assert got["steps"][0]["report"] is None and got["steps"][1]["report"] == "step_0000200/report.html"
    page = path.read_text()
    assert '<a href="step_0000200/report.html">step_0000200</a>' in page
    text = " ".join(parse(path).text)
    assert set(NUMBER.findall(text)) - {num(x) for x in leaves(got)} == set()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["checkpoint", "run"])
def test_the_page_renders_in_headless_chromium_from_a_copied_folder(tmp_path: Path, report: tuple,
                                                                    which: str) -> None:
    """The checkpoint's page and the run's page over training, each from a copy of its folder."""
    browser = require_chromium()
    path = report[0] if which == "checkpoint" else over_training_page(tmp_path, report).diagnostics_root / REPORT
    copied = tmp_path / "elsewhere"
    shutil.copytree(path.parent, copied)  # inline pictures: the copy works on its own
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = run_command([browser, *flags, "--dump-dom", (copied / REPORT).as_uri()]).stdout
    assert "data:image/png;base64," in dom
    if which == "checkpoint":
        assert '<table id="sinks-per-image">' in dom and 'id="maps"' in dom
    else:  # the steps' table, its link to step 200's page
        assert '<a href="step_0000200/report.html">step_0000200</a>' in dom
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, "--window-size=1366,768", "--hide-scrollbars", f"--screenshot={shot}",
                    (copied / REPORT).as_uri()], capture_output=True, timeout=120)
    pixels = np.asarray(Image.open(shot).convert("L"))
    assert pixels.shape == (768, 1366) and pixels.std() > 20  # a rendered page, not a blank one
