"""Training-free mitigations from the command line (docs/trainfree.md).

    python -m vitsinks.trainfree ckpt=runs/<name>/checkpoints/last.pt method=test_time_register
    python -m vitsinks.trainfree ckpt=... method=mean_massive probes=false       # diagnostics only
    python -m vitsinks.trainfree model.pretrained=<timm name or file> method=test_time_register data=imagenet ...

Fits the edit on the first `trainfree.fit_images` TRAIN images of the checkpoint's data, writes the derived run
`<runs_dir>/<source>+<method>/` (a checkpoint that every command reads with the edit on), then diagnoses it and,
with `trainfree.probes` (default), runs its linear and dense probes as after training (it says which, on how many
images and roughly how long first; `probes=false` skips them). Its `status.json` says `finished` once the last
result is written (`failed` or `stopped` otherwise). The leaderboard shows it as the row `<variant> + <method
label>` beside the trained variants.
"""

from __future__ import annotations

import json

from omegaconf import DictConfig

from vitsinks.configs.cli import hydra_command
from vitsinks.run.imported import with_checkpoint
from vitsinks.train.checkpoint import load_backbone
from vitsinks.trainfree.derive import DERIVING, analyse, derive, derived_run
from vitsinks.trainfree.plan import describe
from vitsinks.utils.distributed import resolve_device


def main(cfg: DictConfig) -> None:
    if not cfg.trainfree.method:
        derive(cfg)  # its error names the methods
    cfg = with_checkpoint(cfg)  # a pretrained model: its imported run's checkpoint
    with derived_run(cfg).locked(DERIVING) as run:  # from the existence check to the last result: one writer
        derive(cfg, out=run, overwrite=cfg.trainfree.overwrite)
        with run.working():  # `finished` once its last result is written
            if cfg.trainfree.probes:
                model, run_cfg = load_backbone(run.last)
                print(describe(run_cfg, model.to(resolve_device(cfg.cluster.device)).eval(), "probes=false"),
                      flush=True)
            out = analyse(run, cfg.trainfree.probes)
    print(json.dumps(out, indent=1, default=str))
    print(f"derived run {run.path} ({cfg.trainfree.method} of {cfg.ckpt or cfg.model.pretrained})")


cli = hydra_command(main, aliases={k: f"trainfree.{k}" for k in ("method", "fit_images", "neurons", "outlier_k",
                                                                  "massive", "probes", "overwrite")})

if __name__ == "__main__":
    cli()
