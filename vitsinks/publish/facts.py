"""What a model card states about an exported checkpoint, each fact read from the checkpoint and its run's files:
the variant (name, description, settings, hub tags), the training, the probes of this checkpoint (the leaderboard's
probe columns, with protocol and seed; the missing ones with their command), its diagnostics summary, and where the
run's config differs from the reference's recipe (`recipe=paper`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.schema import exp_names, load_config, to_container
from vitsinks.configs.search import options, yaml_description
from vitsinks.models import MITIGATIONS, SIZES, SinkBlock, run_variant
from vitsinks.models.config import ARCH_TAGS, config_values
from vitsinks.models.kinds import DEFAULT_KIND, KINDS
from vitsinks.probes.probe_results import DenseResult, LinearResult
from vitsinks.publish.provenance import Source
from vitsinks.quant.quant_results import QuantResult
from vitsinks.report.collect import result_types
from vitsinks.utils import files
from vitsinks.utils.rundir import FINAL, RunDir

LIBRARY_TAGS = ("vitsinks", "attention-sink", "vision-transformer")  # every exported model's
RECIPE = "paper"  # the reference's recipe (`recipe=paper`), what the model notes compare with
NOT_SETTINGS = ("name",)  # keys of a composed config that name a run, not settings


@dataclass(frozen=True)
class Probe:
    """One probe value of the checkpoint: its column's label, value and number style, protocol and seed."""

    label: str
    value: float
    fmt: str
    protocol: str
    seed: int | None


@dataclass
class Facts:
    """Everything the card states (see the module docstring)."""

    run: str
    checkpoint: str
    variant: str
    description: str
    settings: dict[str, str]
    tags: list[str]
    architecture: dict[str, Any]
    training: dict[str, str]
    probes: list[Probe] = field(default_factory=list)
    other_checkpoint: list[str] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    summary_file: str = ""
    notes: list[tuple[str, str, str]] = field(default_factory=list)


def shown(value: Any) -> str:
    """A config value as the card writes it (as on a command line, booleans and None as YAML writes them)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return ", ".join(f"{k}={shown(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def variant_settings(model_cfg: Any) -> dict[str, str]:
    """`model.<field>` -> value of what makes the variant: a non-softmax attention kind, registers, the qk-norm and
    RoPE switches, mitigations."""
    values = config_values(model_cfg)
    out = {}
    if str(values.get("attn") or DEFAULT_KIND) != DEFAULT_KIND:
        out["model.attn"] = str(values["attn"])
        kind = KINDS[str(values["attn"])]
        settings = kind.settings(values.get("kind_settings"))
        for f in dataclasses.fields(settings):  # the settings that differ from the kind's defaults
            if getattr(settings, f.name) != f.default:
                out[f"model.kind_settings.{f.name}"] = shown(getattr(settings, f.name))
    if int(values.get("registers") or 0):
        out["model.registers"] = str(values["registers"])
    out.update({f"model.{name}": "true" for name in ARCH_TAGS if values.get(name) is True})
    for name, m in MITIGATIONS.items():
        if m.setting(values.get(name)) is not None:
            arch = m.arch(values[name])
            out[f"model.{name}"] = shown(OmegaConf.to_container(arch) if OmegaConf.is_config(arch) else arch)
    return out


def hub_tags(model_cfg: Any) -> list[str]:
    """The hub tags of a model of this config: the library's, then the variant's."""
    values = config_values(model_cfg)
    tags = list(LIBRARY_TAGS)
    if str(values.get("attn") or DEFAULT_KIND) != DEFAULT_KIND:
        tags.append(f"{values['attn']}-attention")
    if int(values.get("registers") or 0):
        tags.append("registers")
    tags += [name.replace("_", "-") for name in ARCH_TAGS if values.get(name) is True]  # qk-norm, rope
    tags += [m.hub_tag or name.replace("_", "-") for name, m in MITIGATIONS.items()
             if m.setting(values.get(name)) is not None]
    return list(dict.fromkeys(tags))


def exp_description(variant: str) -> str:
    """The first comment of the exp config named as the variant; '' without one."""
    path = options().get("exp", {}).get(variant)
    return yaml_description(Path(path).read_text()) if path is not None else ""


def architecture(source: Source) -> dict[str, Any]:
    """The backbone's size, as the checkpoint holds it."""
    m = source.model
    return {"size": str(source.cfg.model.size), "width": m.embed_dim, "depth": len(m.blocks),
            "heads": cast(SinkBlock, m.blocks[0]).attn.num_heads, "patch": m.patch_embed.patch_size[0],
            "image size": m.patch_embed.img_size[0], "registers": m.num_reg_tokens,
            "parameters": sum(p.numel() for p in m.parameters())}


def training(source: Source) -> dict[str, str]:
    """The training's data, objective, schedule, views and seed, and how far it went."""
    c = source.cfg
    data = f"{c.data.name}, {c.data.image_size} px, {c.data.num_classes} classes"
    if c.data.name == "synthetic":
        data += f" ({c.data.train_size} training images per epoch, {c.data.val_size} validation images)"
    objective = str(c.objective.name) + (f" (lambda {c.objective.lamb:g})" if c.objective.name == "lejepa" else "")
    schedule = (f"{c.train.epochs} epochs" + (f", at most {c.train.max_steps} steps" if c.train.max_steps else "")
                + f", batch {c.train.batch_size}, lr {c.train.lr:g}, weight decay {c.train.weight_decay:g}, "
                  f"warmup {c.train.warmup_epochs:g} epochs, precision {c.train.precision}")
    views = (f"{c.views.n_global} x {c.views.global_size} px + {c.views.n_local} x {c.views.local_size} px "
             f"({c.views.style})")
    out = {"data": data, "objective": objective, "schedule": schedule, "views": views, "seed": str(c.seed),
           "exp": str(c.exp)}
    if source.step is not None:
        out["trained"] = f"{source.step} steps of {c.train.batch_size} images"
    return out


def command_path(ckpt: Path) -> str:
    """The checkpoint as the card's commands name it: relative here, else `<runs_dir>/<run>/...`."""
    rel = os.path.relpath(ckpt.resolve(), Path.cwd())
    return rel if not rel.startswith("..") else f"<runs_dir>/{ckpt.parent.parent.name}/checkpoints/{ckpt.name}"


def probes(source: Source, facts: Facts) -> None:
    """Fill `facts` with the checkpoint's probe values, those of another checkpoint and the probes missing."""
    run, found = source.run, set()
    if run is not None:
        for t in result_types():
            if t is QuantResult:  # the changes the W8A8 copy makes, not this model's measurements
                continue
            values, probed = t.collect(run), t.probed(run)
            for c in [*t.columns(), *t.extra_columns(set(values))]:
                v = values.get(c.key, math.nan)
                if not c.probe or not isinstance(v, float | int) or math.isnan(v):
                    continue
                made = probed.get(c.key)
                if made is not None and made.checkpoint not in (None, source.ckpt.name):
                    facts.other_checkpoint.append(f"{c.label} (of {made.checkpoint})")
                    continue
                facts.probes.append(Probe(c.label, float(v), c.fmt, c.probe, None if made is None else made.seed))
                found.add(t.kind)
    ckpt = command_path(source.ckpt)
    if source.cfg.data.num_classes and LinearResult.kind not in found:
        facts.missing.append(("linear probe", f"python -m vitsinks.eval.linear ckpt={ckpt}"))
    if DenseResult.kind not in found:
        facts.missing.append(("dense probe (on data with masks: the training data's, or add data=ade20k "
                              "data.root=...)", f"python -m vitsinks.eval.dense ckpt={ckpt}"))


def summary_path(run: RunDir, stem: str) -> Path | None:
    """The diagnostics summary of checkpoint `stem` of `run` (for `last`, the newer of `final` and `last`), or None."""
    found = [p for p in ([run.summary(FINAL)] if stem == "last" else []) + [run.summary(stem)] if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def sinks(source: Source, facts: Facts) -> None:
    """The checkpoint's diagnostics summary (`Facts.summary`), or the command that makes it (`missing`)."""
    path = summary_path(source.run, source.stem) if source.run is not None else None
    if path is None:
        facts.missing.append(("sink diagnostics", f"python -m vitsinks.diagnose ckpt={command_path(source.ckpt)}"))
        return
    facts.summary = files.read_json(path, source.run.rediagnose(path.parent.name))  # type: ignore[union-attr]
    facts.summary_file = f"diagnostics/{path.parent.name}/summary.json"


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): tree}


def recipe_notes(cfg: DictConfig) -> list[tuple[str, str, str]]:
    """(setting, this run's value, the recipe's) for every setting `recipe=paper` changes that the run does not."""
    exp = str(cfg.exp) if str(cfg.exp) in exp_names() else "base"
    default = flat(to_container(load_config([f"exp={exp}"])))
    paper = flat(to_container(load_config([f"exp={exp}", f"recipe={RECIPE}"])))
    run = flat(to_container(cfg))
    keys = [k for k in paper if paper[k] != default.get(k) and k not in NOT_SETTINGS]
    return [(k, _effective(cfg, k, run.get(k)), shown(paper[k])) for k in keys if run.get(k) != paper[k]]


def _effective(cfg: DictConfig, key: str, value: Any) -> str:
    """A run's setting as the card writes it; a size field left at None as the value its model size gives it."""
    group, _, name = key.partition(".")
    spec = SIZES.get(str(cfg.model.size))
    if value is None and group == "model" and spec is not None and hasattr(spec, name):
        return f"{shown(getattr(spec, name))} ({cfg.model.size}'s)"
    return shown(value)


def gather(source: Source) -> Facts:
    """Every fact of the card (see the module docstring)."""
    cfg = source.cfg
    variant = run_variant(cfg)
    facts = Facts(run=source.run.name if source.run is not None else source.ckpt.stem, checkpoint=source.ckpt.name,
                  variant=variant, description=exp_description(variant), settings=variant_settings(cfg.model),
                  tags=hub_tags(cfg.model), architecture=architecture(source), training=training(source))
    probes(source, facts)
    sinks(source, facts)
    facts.notes = recipe_notes(cfg)
    return facts
