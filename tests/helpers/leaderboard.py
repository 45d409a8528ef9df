"""Run folders written by hand for the leaderboard's tests (their numbers known, nothing trained), and a reader of
its Markdown tables."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from vitsinks.configs.schema import load_config
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.diagnostics.summary import rule_record
from vitsinks.quant.quant_results import QuantResult, change
from vitsinks.utils.rundir import RunDir

# (variant, seed) -> (online acc, linear top-1, synthetic mIoU, NOP sinks, broadcast sinks)
RUNS = {("base", 0): (0.50, 60.0, 0.20, 2.0, 0.5), ("base", 1): (0.54, 64.0, 0.24, 4.0, 0.5),
        ("gate+reg", 0): (0.60, 70.0, 0.30, 0.0, 1.0), ("gate+reg", 1): (0.62, 72.0, 0.34, 0.0, 3.0)}

DEFAULT_RULE = rule_record(SinkRules(), 12)  # what `diagnostics` writes by default


def sinks_summary(nop: float, broadcast: float, rule: dict | None = DEFAULT_RULE) -> dict:
    """A diagnostics summary.json with `nop` NOP-like and `broadcast` broadcast sinks per image, counted with `rule`
    (None: no rule recorded)."""
    locs = {"cls": nop, "register": broadcast, "patch": 0.0}
    spi = {"nop": {**locs, "all": nop}, "broadcast": {"cls": 0, "register": broadcast, "patch": 0, "all": broadcast},
           "unclassified": {"cls": 0, "register": 0, "patch": 0, "all": 0},
           "all": {"cls": nop, "register": broadcast, "patch": 0.0, "all": nop + broadcast}}
    return {"sinks_per_image": spi, "massive_activations": {"ratio_by_block": [1.5, 3.0 + nop]},
            **({"rule": rule} if rule else {})}


def make_runs(root: Path, runs: dict = RUNS, rule: dict | None = DEFAULT_RULE) -> Path:
    """Under `root`, a run folder `<variant>-s<seed>` per entry of `runs`, its numbers and sinks written by hand."""
    for (exp, seed), (online, lin, miou, nop, bc) in runs.items():
        run = root / f"{exp}-s{seed}"
        (run / "results").mkdir(parents=True)
        (run / "diagnostics" / "final").mkdir(parents=True)
        (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config([f"exp={exp}", f"seed={seed}"]),
                                                           resolve=True))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 1.0}) + "\n"
                                           + json.dumps({"step": 10, "val/probe_acc": online}) + "\n")
        (run / "results" / "linear.json").write_text(json.dumps({"best": {"top1": lin}}))
        (run / "results" / "dense_synthetic.json").write_text(json.dumps({"mIoU": miou}))
        (run / "diagnostics" / "final" / "summary.json").write_text(json.dumps(sinks_summary(nop, bc, rule)))
    return root


def quant(weight_bits: int = 8, act_bits: int = 8, cosine: float = 0.999, linear: float = -1.0) -> dict:
    """A results/quant.json of that format."""
    return QuantResult(checkpoint="last.pt", weight_bits=weight_bits, act_bits=act_bits, calib_images=4, n_images=4,
                       by_block={"kurtosis": {"fc1": [3.0]}, "inf_norm": {"fc1": [2.0]}}, feature_cosine=cosine,
                       feature_cosine_by_block=[cosine], online_top1=change(50.0, 50.0 + linear),
                       linear_top1=change(60.0, 60.0 + linear)).to_json()


def plant(root: Path, name: str, *overrides: str, seed: int = 0, exp: str = "gate+reg", steps: int | None = 30,
          online: float = 0.5, linear: float | None = 60.0, rule: dict | None = DEFAULT_RULE,
          quant_json: dict | None = None, source: str | None = None) -> RunDir:
    """A run folder written by hand: its config (`exp`, `seed`, `overrides`), metrics up to `steps` (None: none),
    its linear probe, its diagnostics summary counted with `rule` (None: no summary) and its quant.json; `source`
    (`<run>[/<checkpoint file>]`) makes it that run's mean_massive edit."""
    run = RunDir(root / name)
    run.results.mkdir(parents=True)
    over = [f"exp={exp}", f"seed={seed}", *overrides]
    if source is not None:
        parent, _, ckpt = source.partition("/")
        over = [*over, "trainfree.method=mean_massive",
                f"trainfree.source={root / parent / 'checkpoints' / (ckpt or 'last.pt')}"]
    run.config.write_text(OmegaConf.to_yaml(load_config(over), resolve=True))
    if source is not None:
        run.write_status("finished", method="mean_massive")  # a derived run that finished
    if steps is not None:
        run.metrics.write_text(json.dumps({"step": steps, "loss": 1.0}) + "\n"
                               + json.dumps({"step": steps, "val/probe_acc": online}) + "\n")
    if linear is not None:
        run.result("linear").write_text(json.dumps({"checkpoint": str(run.last), "seed": seed,
                                                    "best": {"top1": linear}}))
    if rule is not None:
        run.summary("final").parent.mkdir(parents=True)
        run.summary("final").write_text(json.dumps(sinks_summary(1.0, 0.0, rule)))
    if quant_json is not None:
        run.result("quant").write_text(json.dumps(quant_json))
    return run


def cells(md: str, title: str) -> dict[str, dict[str, str]]:
    """The Markdown table under `## title`: variant -> header -> cell."""
    lines = [r for r in md.split(f"## {title}\n")[1].split("\n## ")[0].splitlines() if r.startswith("| ")]
    split = [[c.strip() for c in r.strip("|").split(" | ")] for r in lines]
    return {r[0]: dict(zip(split[0], r, strict=True)) for r in split[1:]}
