"""Causal interventions on sink heads from the command line (docs/interventions.md).

    python -m vitsinks.intervene ckpt=runs/<name>/checkpoints/last.pt [data=...] [n_images=256]
    python -m vitsinks.intervene run=runs/<name> heads=[0:1,3:0] edits=[zero_sink_value,redirect_sink_attention]
    python -m vitsinks.intervene model=vit_small model.pretrained=<timm name or file> data=imagenet data.root=...
    python -m vitsinks.intervene hub=hf:facebook/dinov2-small heads=9:2 data=imagenet data.root=...  # unmodified
    python -m vitsinks.intervene ckpt=... shard=0 nshards=4         # a quarter of the heads (then merge=...)
    python -m vitsinks.intervene ckpt=... nshards=4 cluster=slurm   # the 4 shards as one SLURM job array
    python -m vitsinks.intervene merge=runs/<name>/interventions/last

The model is any source a command takes (`ckpt=`, `run=`, `model.pretrained=`, `hub=`). Edits the first `n_images`
validation images in the order of `selection` (`mean_sink_value` and `mean_registers` average over the next
`intervene.heldout_images`), in float32 on `cluster.device`; every row of interventions.csv names its images' split
indices. Outputs (interventions.csv, by_head.csv, by_class.md, summary.json, interventions.png, config.yaml) in
`<run>/interventions/<checkpoint>/` (a loose checkpoint file's or a hub model's: `<runs_dir>/interventions/<model>/`)
or `intervene.out`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.cli import data_overrides, hydra_command, pick_data
from vitsinks.configs.schema import to_container
from vitsinks.configs.upgrade import saved_yaml
from vitsinks.data import build_dataset
from vitsinks.data.selection import select_items
from vitsinks.interventions import SinkRules, intervene, report
from vitsinks.run import slurm
from vitsinks.run.source import ModelSource, Opened, open_model, resolve
from vitsinks.utils import files
from vitsinks.utils.distributed import resolve_device
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.files import BadFile
from vitsinks.utils.generations import claim
from vitsinks.utils.rundir import CONFIG, RunDir, in_run

ALIASES = ("n_images", "heldout_images", "heads", "edits", "shard", "nshards", "merge")


def output_dir(cfg: DictConfig, source: ModelSource | None = None, write: bool = True) -> Path:
    """`intervene.out`, else the model's `interventions` folder (`ModelSource.analyses`), made and recorded as
    the model's with `write` (another model's folder is refused either way)."""
    if cfg.intervene.out:
        return Path(cfg.intervene.out)
    return (source or resolve(cfg)).analyses("interventions", cfg.runs_dir, write)


def _stage1(source: ModelSource, data_keys: Sequence[str] | None,
            index: list[int]) -> tuple[Path, dict[str, np.ndarray]] | None:
    """(the checkpoint's `per_image.npz`, its fields of the edited images) when it is not older than the
    checkpoint, no other data was chosen and it holds these very images in this order; else None."""
    path = source.checkpoint
    if path is None or not in_run(path) or data_keys or not path.is_file():
        return None
    npz = RunDir.of_checkpoint(path).per_image(path.stem)
    if not npz.is_file() or npz.stat().st_mtime < path.stat().st_mtime:
        return None
    try:
        d = files.read_npz(npz, "")
    except BadFile:
        print(f"note: {npz} is torn: its diagnostics fields are computed again", flush=True)
        return None
    images, n = d["sink_idx"].shape[0], len(index)
    if images < n or "image_index" not in d or d["image_index"][:n].tolist() != index:
        return None
    return npz, {k: v[:n] if v.ndim and v.shape[0] == images else v for k, v in d.items()}


def run(cfg: DictConfig, data_keys: Sequence[str] | None = ()) -> tuple[dict[str, Any], Path]:
    """Interventions of one shard (all heads when nshards=1), written: (summary or shard metadata, output folder)."""
    st, source = cfg.intervene, resolve(cfg)
    output_dir(cfg, source, write=False)  # a folder of another model's is refused before the model is loaded
    model = open_model(source, cfg)
    source.write(model.module)  # a pretrained model's import: the interventions go into it
    out = output_dir(cfg, source)
    claim(out, report.INTERVENTIONS)  # before any work: a folder of the user's is refused, nothing written into it
    target = out / report.SHARDS / f"{st.shard}-of-{st.nshards}" if st.nshards > 1 else out
    with files.FileLock(target.parent / f".{target.name}.lock", f"the interventions in {target}", INTERVENING):
        return _run(cfg, st, model, data_keys, out)


INTERVENING = "wait for it to finish: another command writes the same interventions (or give intervene.out=)"


def _run(cfg: DictConfig, st: DictConfig, model: Opened, data_keys: Sequence[str] | None,
         out: Path) -> tuple[dict[str, Any], Path]:
    """`run`'s work, under the lock of its output."""
    source, data = model.source, pick_data(cfg.data, model.cfg.data, data_keys)
    (edited, index), (heldout, heldout_index) = select_items(build_dataset(data, "val", model.cfg.seed),
                                                            [st.n_images, st.heldout_images], cfg.selection,
                                                            data.on_bad_image)
    x = model.batch(edited, cfg.selection)[0]
    x_held = model.batch(heldout, cfg.selection)[0] if heldout else x[:0]
    labels = None
    if isinstance(edited[0][1], (int, np.integer)):
        labels = torch.tensor([int(it[1]) for it in edited])
    device = resolve_device(cfg.cluster.device)
    subject = model.to(device).backbone.eval()
    rules = SinkRules.from_config(cfg.diagnostics)
    reused = _stage1(source, data_keys, index)
    res = intervene(subject, x.to(device), None if labels is None else labels.to(device), x_held.to(device), st,
                    rules, None if reused is None else reused[1], index=index, heldout_index=heldout_index)
    settings = {k: v for k, v in to_container(st).items() if k not in ("shard", "merge", "out")}
    protocol = to_container(cfg.selection)  # written as `protocol`, as always
    key_src = json.dumps([source.identity(), to_container(data), settings, protocol, rules.rule, rules.eps,
                          rules.ratio, rules.use_stable_rank, rules.block0_policy],
                         sort_keys=True, default=str)
    meta = {"subject": f"{source.name} ({subject.name})", "n_images": res.n_images, "n_blocks": res.n_blocks,
            "protocol": protocol,
            "images": {"edited": len(index), "heldout": len(heldout_index), "order": str(cfg.selection.order),
                       "seed": cfg.selection.seed, "image_list": cfg.selection.image_list,
                       "batch_size": st.batch_size, "random_seed": st.seed},
            "selected": [f"{b}:{h}" for b, h in res.selected], "heads": [f"{b}:{h}" for b, h in res.heads],
            "edits": res.edits, "reference_formulas": bool(st.reference_formulas),
            "donor_cosine_form": res.donor_cosine_form, "min_class_events": st.min_class_events,
            "mean_source": res.mean_source,
            "mean_sink_value_skipped": res.mean_skipped, "mean_registers_source": res.register_mean_source,
            "checks": res.checks.as_dict(), "stage1": f"reused {reused[0]}" if reused else "computed",
            "rule": rules.record(),
            "shard": st.shard, "nshards": st.nshards, "key": hashlib.sha1(key_src.encode()).hexdigest()}
    config = saved_yaml(cfg)
    if st.nshards > 1:
        files.write_text(report.write_shard(out, st.shard, st.nshards, res.rows, meta) / CONFIG, config)
        return meta, out
    return report.write_outputs(out, res.rows, meta, config), out


def shard_job(config: dict[str, Any], data_keys: Sequence[str] | None = ()) -> str:
    """What one SLURM array task runs: one shard."""
    run(OmegaConf.create(config), data_keys)
    return f"shard {config['intervene']['shard']} of {config['intervene']['nshards']} done"


def submit_shards(cfg: DictConfig, data_keys: Sequence[str] | None) -> Path:
    """`nshards` SLURM array tasks, one per shard; returns the output folder (merge it when they are done)."""
    slurm.check_submittable(cfg)
    source = resolve(cfg)
    if source.trained:  # a missing checkpoint is refused here; a pretrained model is imported once, for its shards
        path = source.needs_checkpoint("intervene")
        if source.plan is not None:
            source.write()
            cfg = OmegaConf.merge(cfg, {"ckpt": str(path), "model": {"pretrained": None}})  # type: ignore[assignment]
        elif not path.is_file():
            raise InputNotFound(f"checkpoint {path} not found")
    out = output_dir(cfg)
    claim(out, report.INTERVENTIONS)
    cfgs = [cast(DictConfig, OmegaConf.merge(cfg, {"intervene": {"shard": k}})) for k in range(cfg.intervene.nshards)]
    jobs = slurm.submit(cfgs, slurm.logs_dir(cfg), job=partial(shard_job, data_keys=data_keys))
    (out / report.SHARDS).mkdir(parents=True, exist_ok=True)
    files.write_json(out / report.SHARDS / "array.json", {"job_ids": [j.job_id for j in jobs]})
    print(f"submitted SLURM job array {jobs[0].job_id.split('_')[0]} ({len(jobs)} shards); when it has finished:\n"
          f"  python -m vitsinks.intervene merge={out}")
    return out


def main(cfg: DictConfig) -> None:
    st = cfg.intervene
    if st.merge:
        with files.FileLock(Path(st.merge).parent / f".{Path(st.merge).name}.lock", f"the interventions in "
                            f"{st.merge}", INTERVENING):
            summary = report.merge(Path(st.merge))
        print(report.to_markdown(summary))
        print(f"outputs in {st.merge}")
        return
    resolve(cfg)  # the model named once: two sources, or none, are one line before anything is read
    overridden = data_overrides()
    if cfg.cluster.name == "slurm" and st.nshards > 1:
        submit_shards(cfg, overridden)
        return
    result, out = run(cfg, overridden)
    if st.nshards > 1:
        print(f"shard {st.shard} of {st.nshards} written to {out / 'shards'}; when every shard is done: "
              f"python -m vitsinks.intervene merge={out}")
    else:
        print(report.to_markdown(result))
        print(f"outputs in {out}")


# `n_images=`, `heads=`, `edits=`, `shard=`, ... are short for `intervene.<key>=`; one head or edit needs no brackets
cli = hydra_command(main, aliases={k: f"intervene.{k}" for k in ALIASES}, lists=("heads", "edits"))

if __name__ == "__main__":
    cli()
