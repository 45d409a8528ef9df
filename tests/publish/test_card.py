"""The model card of the committed first run (eval/first_run/inputs): the hub's metadata parses, and every number of
its probe and sink tables is one of the run's own file values; a planted value shows; missing results and results of
another checkpoint are named."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from huggingface_hub import ModelCard
from omegaconf import OmegaConf

from tests.helpers.exported_runs import STEP, first_run
from vitsinks.diagnostics.rules import CLASSES
from vitsinks.publish.card import Export, render
from vitsinks.publish.facts import gather
from vitsinks.publish.folder import preprocessing
from vitsinks.publish.provenance import read
from vitsinks.quant.quant_results import QuantResult
from vitsinks.utils.rundir import RunDir

NUMBER = re.compile(r"^-?\d+(\.\d+)?(e-?\d+)?$")


def card_of(run: RunDir, timm_layout: bool = True) -> str:
    source = read(run.last)
    export = Export("naflexvit" if timm_layout else "vitsinks", "me/gate-reg", True, preprocessing(source), "other",
                    "naflexvit_base_patch16_gap" if timm_layout else None, 0.0, 2,
                    [] if timm_layout else ["a reason"])
    return render(gather(source), export)


def section(card: str, title: str) -> str:
    return card.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def rows(text: str) -> list[list[str]]:
    """The body rows of the markdown tables in `text`."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return [r for r in cells if not any(c in ("probe", "class \\ sink on") for c in r[:1])]


def numbers(tree: object) -> list[float]:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in numbers(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in numbers(v)]
    return [float(tree)] if isinstance(tree, int | float) and not isinstance(tree, bool) else []


def file_values(run: RunDir) -> set[str]:
    """Every number of the run's result files, summary and metrics, as the card may write it (the value or 100 x it,
    two decimals or three significant digits)."""
    found = [x for p in run.results.glob("*.json") for x in numbers(json.loads(p.read_text()))]
    found += numbers(json.loads(run.summary("final").read_text()))
    found += [x for line in run.metrics.read_text().splitlines() for x in numbers(json.loads(line))]
    return {f"{v:{fmt}}" for x in found for v in (x, 100 * x) for fmt in (".2f", ".3g")}


def test_the_first_runs_card_states_its_files_numbers(runs: Path) -> None:
    run = first_run(runs)
    card = card_of(run)
    meta = ModelCard(card).data
    assert (meta.library_name, meta.pipeline_tag, meta.license) == ("timm", "image-feature-extraction", "other")
    assert {"vitsinks", "attention-sink", "gated-attention", "registers", "timm"} <= set(meta.tags)

    linear = json.loads(run.result("linear").read_text())["best"]["top1"]
    dense = 100 * json.loads(run.result("dense_synthetic").read_text())["mIoU"]
    online = 100 * [m for m in map(json.loads, run.metrics.read_text().splitlines()) if "val/probe_acc" in m][-1][
        "val/probe_acc"]
    probes = {r[0]: r[1] for r in rows(section(card, "Probes"))}
    assert probes["linear top-1"] == f"{linear:.2f}" and probes["online probe top-1"] == f"{online:.2f}"
    assert probes["synthetic mIoU (DINOv2-style probe)"] == f"{dense:.2f}"

    summary = json.loads(run.summary("final").read_text())
    sinks = rows(section(card, "Sinks"))
    assert [r[0] for r in sinks] == [*CLASSES, "all"]
    for r in sinks:
        assert r[1:] == [f"{summary['sinks_per_image'][r[0]][loc]:.2f}" for loc in ("cls", "register", "patch", "all")]
    gate = summary["gate_mean_by_block"]
    assert f"mean gate {sum(gate) / len(gate):.2f}" in section(card, "Sinks")

    allowed = file_values(run)
    cells = [c for r in rows(section(card, "Probes")) + sinks for c in r[1:] if NUMBER.match(c)]
    assert cells and all(c in allowed for c in cells), [c for c in cells if c not in allowed]
    batch = OmegaConf.load(run.config).train.batch_size
    assert f"- **trained**: {STEP} steps of {batch} images" in card  # the checkpoint's own progress
    assert "## Missing results" not in card


def test_a_planted_value_is_what_the_card_shows(runs: Path) -> None:
    run = first_run(runs)
    result = json.loads(run.result("linear").read_text())
    result["best"]["top1"] = 12.3456
    run.result("linear").write_text(json.dumps(result))
    probes = {r[0]: r[1] for r in rows(section(card_of(run), "Probes"))}
    assert probes["linear top-1"] == "12.35"


def test_missing_results_and_another_checkpoints_are_named_with_their_commands(runs: Path) -> None:
    run = first_run(runs)
    run.result("linear").unlink()
    dense = json.loads(run.result("dense_synthetic").read_text())
    dense["checkpoint"] = str(run.step_checkpoint(50))
    run.result("dense_synthetic").write_text(json.dumps(dense))
    (run.summary("final")).unlink()
    card = card_of(run)
    probes = [r[0] for r in rows(section(card, "Probes"))]
    assert "linear top-1" not in probes and not any("mIoU" in p for p in probes)
    assert "(of step_0000050.pt)" in section(card, "Probes")
    missing = {r[0].split(" (")[0]: r[1] for r in rows(section(card, "Missing results")) if r[0] != "result"}
    assert set(missing) == {"linear probe", "dense probe", "sink diagnostics"}
    assert missing["dense probe"].startswith("`python -m vitsinks.eval.dense ckpt=")
    assert missing["linear probe"].startswith("`python -m vitsinks.eval.linear ckpt=")
    assert missing["sink diagnostics"].startswith("`python -m vitsinks.diagnose ckpt=")
    assert "no sink diagnosis yet" in section(card, "Sinks")


def test_a_card_of_vitsinks_layout_names_its_library_and_why(runs: Path) -> None:
    card = card_of(first_run(runs), timm_layout=False)
    assert ModelCard(card).data.library_name == "vitsinks"
    assert "timm.create_model" not in card and 'pretrained.load("vitsinks:me/gate-reg")' in card
    assert "timm cannot build it from a config: a reason." in card


def test_the_w8a8_copys_changes_are_no_probe_of_this_model(runs: Path) -> None:
    run = first_run(runs)
    change = {"fp32": 94.0, "quant": 93.0, "delta": -1.0}
    quant = QuantResult(str(run.last), 8, 8, 8, 8, {"kurtosis": {}, "inf_norm": {}}, 0.99, [0.99] * 4,
                        online_top1=change, linear_top1=change)
    run.result("quant").write_text(json.dumps(quant.to_json()))
    assert any(c.probe and not math.isnan(v) for c in QuantResult.columns()
               for k, v in QuantResult.collect(run).items() if k == c.key)  # the leaderboard reads it as probed
    assert "W8A8" not in section(card_of(run), "Probes")
