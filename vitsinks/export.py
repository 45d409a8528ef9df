"""Export a trained variant as a hub-ready folder: weights, config and model card (docs/export.md).

    python -m vitsinks.export ckpt=runs/<name>/checkpoints/last.pt out=exports/<name>
    python -m vitsinks.export run=runs/<name> out=exports/<name>          # the run's last checkpoint
    python -m vitsinks.export run=runs/<name> out=exports/<name> push=true repo=<user>/<name>

`out` (a new or empty folder, or an earlier export of the same checkpoint) gets `model.safetensors`, `config.json`
and a model card `README.md`; a variant timm builds is written in timm's layout (`timm.create_model("local-dir:<out>",
pretrained=True)`), and every export loads with `vitsinks.pretrained.load("vitsinks:<out>")`. A derived run is refused.
`push=true` uploads the folder to `HF_ENDPOINT` (`private=true`: a new private repository); `license=` sets the card's.
"""

from __future__ import annotations

from omegaconf import DictConfig

from vitsinks.configs.cli import hydra_command
from vitsinks.publish.folder import push, write_folder
from vitsinks.run.source import resolve


def main(cfg: DictConfig) -> None:
    if cfg.hub:  # a hub model is no checkpoint vitsinks trained: one line (two sources too, `run.source`)
        resolve(cfg).needs_checkpoint("export", "ckpt= or run=")
    out, facts, export = write_folder(cfg)
    how = (f"timm's {export.layout} layout" if export.timm else
           f"vitsinks' own layout ({'; '.join(export.reasons)})")
    print(f"exported {facts.run}/{facts.checkpoint} ({facts.variant}) to {out} in {how}")
    for what, command in facts.missing:
        print(f"note: the card lists as missing the {what}: {command}")
    if cfg.export.push:
        url = push(out, str(cfg.export.repo), bool(cfg.export.private), f"vitsinks export of {facts.run} "
                   f"({facts.variant}, {facts.checkpoint})")
        print(f"pushed to {cfg.export.repo}: {url}")


cli = hydra_command(main, aliases={k: f"export.{k}" for k in ("out", "push", "repo", "private", "license")})

if __name__ == "__main__":
    cli()
