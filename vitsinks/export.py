"""Export a trained variant as a hub-ready folder: weights, config and model card (docs/export.md).

    python -m vitsinks.export ckpt=runs/<name>/checkpoints/last.pt out=exports/<name>
    python -m vitsinks.export run=runs/<name> out=exports/<name>          # the run's last checkpoint
    python -m vitsinks.export run=runs/<name> out=exports/<name> push=true repo=<user>/<name>

`out` (a new or empty folder, or an earlier export of the same checkpoint, whose files are replaced) gets
`model.safetensors`, `config.json` and `README.md`, a model card with the hub's metadata and the run's facts: the
variant, data and recipe, steps, the probes with their protocols, the sinks by class and location, where the run
differs from the reference's recipe, and the results still missing with the commands that make them. A variant timm
builds from a config (the base ViT, registers, the elementwise gate) is written in timm's own layout and loads with
`timm.create_model("local-dir:<out>", pretrained=True)` (or `hf-hub:<repo>`); every exported folder loads with
`vitsinks.pretrained.load("vitsinks:<out>")`. A derived run (a training-free edit, the W8A8 copy) is refused: its
edit is not in any weights file. `push=true repo=<user>/<name>` uploads the folder with huggingface_hub to
`HF_ENDPOINT` (default the Hugging Face hub; `private=true` for a new private repository); `license=` sets the card's.
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
