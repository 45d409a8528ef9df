"""Sink diagnostics from the command line.

    python -m vitsinks.diagnose ckpt=runs/<name>/checkpoints/last.pt [data=fashion_mnist] [n_images=32]
    python -m vitsinks.diagnose run=runs/<name>          # every checkpoint of a run + the over-training plot
    python -m vitsinks.diagnose model=dinov2_small_reg data=imagenet data.root=...   # a pretrained timm model

Outputs go to `<run>/diagnostics/<checkpoint>/` (`per_image.npz`, `summary.json`, PNG plots); `run=` adds
`<run>/diagnostics/over_training.{png,json,csv}`.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from vitsinks import checkpoint as ckpt
from vitsinks.config import config_dir, register_configs
from vitsinks.data import build_dataset
from vitsinks.diagnostics import fixed_images, run_diagnostics
from vitsinks.models import SinkViT, model_from_config

STEP_RE = re.compile(r"step_(\d+)\.pt$")


def load_backbone(path: Path) -> tuple[SinkViT, DictConfig]:
    """The backbone of a vitsinks checkpoint, built from the configuration stored in it."""
    return backbone_from_state(ckpt.load(path), path)


def backbone_from_state(state: dict[str, Any], path: Path) -> tuple[SinkViT, DictConfig]:
    """The backbone and run configuration of a loaded vitsinks checkpoint (`path` names it in errors)."""
    if "config" not in state or "model" not in state:
        raise ValueError(f"{path} is not a vitsinks training checkpoint (no config/model inside)")
    cfg = OmegaConf.create(state["config"])
    model = model_from_config(OmegaConf.merge(cfg.model, {"pretrained": None}))
    sd = {k[len("backbone."):]: v for k, v in state["model"].items() if k.startswith("backbone.")}
    model.load_state_dict(sd)
    return model, cfg


def diagnose_checkpoint(path: Path, cfg: DictConfig, data_cfg: DictConfig | None = None,
                        out_dir: Path | None = None) -> dict[str, Any]:
    """Diagnose one checkpoint on the first `diagnostics.n_images` validation images of its (or `data_cfg`'s) data."""
    model, ckpt_cfg = load_backbone(path)
    data = data_cfg or ckpt_cfg.data
    images, shown = fixed_images(build_dataset(data, "val", ckpt_cfg.seed), cfg.diagnostics.n_images,
                                 ckpt_cfg.views.global_size)
    out = out_dir or path.parent.parent / "diagnostics" / path.stem
    return run_diagnostics(model, images, shown, out, cfg.diagnostics)


def over_training(run_dir: Path, cfg: DictConfig) -> list[tuple[int, dict[str, Any]]]:
    """Sinks vs step for a run: the summaries the training hook wrote, plus a diagnosis of every `step_*.pt`
    checkpoint without a fresh one; then the plot and the tables."""
    from vitsinks.diagnostics.plots import over_training as plot_over_training

    diag = run_dir / "diagnostics"
    summaries = {int(p.parent.name[5:]): p for p in diag.glob("step_*/summary.json")}
    ckpts = {int(STEP_RE.search(p.name).group(1)): p for p in (run_dir / "checkpoints").glob("step_*.pt")}
    stale = [s for s, p in ckpts.items() if s not in summaries or summaries[s].stat().st_mtime < p.stat().st_mtime]
    for step in tqdm(sorted(stale), desc="diagnosing checkpoints", unit="ckpt"):
        diagnose_checkpoint(ckpts[step], cfg)
        summaries[step] = diag / ckpts[step].stem / "summary.json"
    if not summaries:
        raise FileNotFoundError(f"no diagnostics and no checkpoints/step_*.pt in {run_dir}: is it a run directory?")
    rows = [(s, json.loads(summaries[s].read_text())) for s in sorted(summaries)]
    out = diag
    plot_over_training([s for s, _ in rows], [r for _, r in rows], out / "over_training.png")
    (out / "over_training.json").write_text(json.dumps([{"step": s, **r} for s, r in rows], indent=1))
    with (out / "over_training.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "sinks_per_image", "nop", "broadcast", "unclassified", "on_cls", "on_register",
                    "on_patch", "block0", "peak_block"])
        for s, r in rows:
            spi = r["sinks_per_image"]
            freq = r["block_frequency"]
            w.writerow([s, spi["all"]["all"], spi["nop"]["all"], spi["broadcast"]["all"], spi["unclassified"]["all"],
                        spi["all"]["cls"], spi["all"]["register"], spi["all"]["patch"],
                        r["sinks_per_image_block0"]["all"]["all"], int(max(range(len(freq)), key=freq.__getitem__))])
    return rows


def data_overridden() -> bool:
    """Whether this Hydra command line chose the data (`data=`, `data.name=`, `data.root=`)."""
    return any(o.split("=")[0].lstrip("+") in ("data", "data.name", "data.root")
               for o in HydraConfig.get().overrides.task)


def main(cfg: DictConfig) -> None:
    try:
        if cfg.run:
            rows = over_training(Path(cfg.run), cfg)
            print(f"diagnosed {len(rows)} checkpoints; see {Path(cfg.run) / 'diagnostics' / 'over_training.png'}")
        elif cfg.ckpt:
            path = Path(cfg.ckpt)
            if not path.is_file():
                raise FileNotFoundError(f"checkpoint {path} not found")
            s = diagnose_checkpoint(path, cfg, cfg.data if data_overridden() else None)
            print(json.dumps(s["sinks_per_image"], indent=1))
            print(f"outputs in {path.parent.parent / 'diagnostics' / path.stem}")
        else:  # a model from the config, typically model.pretrained=<timm name or file>
            model = model_from_config(cfg.model)
            images, shown = fixed_images(build_dataset(cfg.data, "val", cfg.seed), cfg.diagnostics.n_images,
                                         model.patch_embed.img_size[0])
            out = Path(cfg.runs_dir) / "diagnostics" / (cfg.model.pretrained or cfg.name).replace("/", "_")
            s = run_diagnostics(model, images, shown, out, cfg.diagnostics)
            print(json.dumps(s["sinks_per_image"], indent=1))
            print(f"outputs in {out}")
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


def _alias_argv() -> None:
    """`n_images=N` is short for `diagnostics.n_images=N`."""
    sys.argv = [re.sub(r"^n_images=", "diagnostics.n_images=", a) for a in sys.argv]


register_configs()
hydra_main = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(main)

if __name__ == "__main__":
    _alias_argv()
    hydra_main()
