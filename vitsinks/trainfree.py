"""Training-free mitigations: post-hoc edits of a trained backbone or a hub model, fitted on a few images.

    python -m vitsinks.trainfree ckpt=runs/<name>/checkpoints/last.pt method=test_time_register
    python -m vitsinks.trainfree ckpt=... method=mean_massive probes=false       # diagnostics only
    python -m vitsinks.trainfree model.pretrained=<timm name or file> method=test_time_register data=imagenet ...
    python -m vitsinks.trainfree hub=hf:facebook/dinov2-small method=test_time_register data=imagenet ...

The model is any source a command takes (`ckpt=`, `run=`, `model.pretrained=`, `hub=`). Fits the edit on the first
`trainfree.fit_images` TRAIN images of the model's data, writes the derived run `<runs_dir>/<source>+<method>/` (a hub
model's: `<runs_dir>/trainfree/<hub>+<method>/`), which every command reads with the edit on, then diagnoses it and,
with `trainfree.probes` (default), runs its linear and dense probes. Its `status.json` says `finished` once the last
result is written; the leaderboard shows it as the row `<variant> + <method label>` (not a hub model's).
"""

from __future__ import annotations

import json

from omegaconf import DictConfig

from vitsinks.configs.cli import hydra_command
from vitsinks.posthoc.plan import describe
from vitsinks.run.derive import DERIVING, analyse, derive, derived_run
from vitsinks.run.source import of_checkpoint, open_model, resolve
from vitsinks.utils.distributed import resolve_device


def main(cfg: DictConfig) -> None:
    if not cfg.trainfree.method:
        derive(cfg)  # its error names the methods
    where = derived_run(cfg)  # an unknown method: one line listing them
    source = resolve(cfg)  # the model named once, and there, before anything is written
    with where.locked(DERIVING) as run:  # from the existence check to the last result: one writer
        derive(cfg, out=run, overwrite=cfg.trainfree.overwrite)
        with run.working():  # `finished` once its last result is written
            if cfg.trainfree.probes:
                model = open_model(of_checkpoint(run.last), cfg).to(resolve_device(cfg.cluster.device))
                print(describe(model.cfg, model.backbone, "probes=false", model.inputs.size[0]), flush=True)
            out = analyse(run, cfg.trainfree.probes)
    print(json.dumps(out, indent=1, default=str))
    print(f"derived run {run.path} ({cfg.trainfree.method} of {source.recorded})")


cli = hydra_command(main, aliases={k: f"trainfree.{k}" for k in ("method", "fit_images", "neurons", "outlier_k",
                                                                  "massive", "probes", "overwrite")})

if __name__ == "__main__":
    cli()
