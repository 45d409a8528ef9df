"""The model card (`README.md` of an exported folder): the hub's metadata and the run's facts (`publish.facts`), every
number read from the checkpoint, its run's files or the export's check; a missing result names its command.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from email.message import Message
from typing import Any, cast

from huggingface_hub import ModelCard, ModelCardData

from vitsinks.diagnostics.rules import CLASSES
from vitsinks.diagnostics.summary import describe_rule
from vitsinks.models import MITIGATIONS
from vitsinks.publish.facts import Facts
from vitsinks.publish.timm_format import NAFLEX, VIT
from vitsinks.utils.tables import markdown_table

PIPELINE_TAG = "image-feature-extraction"
PACKAGE = "vitsinks"
TIMM_MODELS = {VIT: "VisionTransformer", NAFLEX: "NaFlexVit"}  # the timm class each timm layout builds


def package_license() -> str:
    """The license the package's metadata declares, else `other` (the hub's word for a license it does not list)."""
    try:
        meta = cast(Message, importlib.metadata.metadata(PACKAGE))  # an email Message: `get` gives None if absent
    except importlib.metadata.PackageNotFoundError:
        return "other"
    return str(meta.get("License-Expression") or meta.get("License") or "other").strip() or "other"


@dataclass(frozen=True)
class Export:
    """How the folder holds the model: layout, where it loads from, preprocessing, timm's check or reasons."""

    layout: str
    where: str
    on_hub: bool
    preprocessing: dict[str, Any]
    license: str
    architecture: str | None = None
    max_diff: float | None = None
    check_images: int = 0
    reasons: list[str] = field(default_factory=list)

    @property
    def timm(self) -> bool:
        return self.layout in TIMM_MODELS


def number(value: float, fmt: str) -> str:
    """A value in its column's number style (`f`: two decimals, `g`: three significant digits)."""
    return f"{value:.3g}" if fmt == "g" else f"{value:.2f}"


def _load_lines(export: Export) -> str:
    pre = export.preprocessing
    size = pre["input_size"][-1]
    resize = round(size / pre["crop_pct"])
    lines = []
    if export.timm:
        spec = f"hf-hub:{export.where}" if export.on_hub else f"local-dir:{export.where}"
        lines += [f"With timm ({TIMM_MODELS[export.layout]}, built from `config.json` alone):", "", "```python",
                  "import timm", "", f'model = timm.create_model("{spec}", pretrained=True).eval()',
                  "tokens = model.forward_features(images)  # (B, 1 + registers + patches, width)", "```", ""]
    lines += ["With vitsinks (its own model, which its diagnostics and interventions read):", "", "```python",
              "from vitsinks import pretrained", "", f'loaded = pretrained.load("vitsinks:{export.where}")',
              "images = loaded.images(pil_images)  # the preprocessing below", "```", "",
              f"Preprocessing: the shorter side resized to {resize} px ({pre['interpolation']}), a centre crop of "
              f"{size} x {size} px, normalised with mean {list(pre['mean'])} and std {list(pre['std'])} "
              f"(`config.json`'s `pretrained_cfg`)."]
    return "\n".join(lines)


def _variant(facts: Facts) -> str:
    a = facts.architecture
    out = [f"A `{facts.variant}` ViT: width {a['width']}, depth {a['depth']}, {a['heads']} heads, patch {a['patch']} "
           f"at {a['image size']} px, {a['registers']} registers, {a['parameters']:,} parameters "
           f"(`model={a['size']}`)."]
    if facts.description:
        out.append(f"The variant (`exp={facts.variant}`): {facts.description}")
    if facts.settings:
        out += ["", "What makes it this variant, against vitsinks' base ViT:", "",
                *markdown_table(["setting", "value"], [[f"`{k}`", f"`{v}`"] for k, v in facts.settings.items()])]
    else:
        out.append("The base ViT: softmax attention, no registers, no block mitigation.")
    return "\n".join(out)


def _probes(facts: Facts) -> str:
    out = []
    if facts.probes:
        rows = [[p.label, number(p.value, p.fmt), p.protocol, "-" if p.seed is None else str(p.seed)]
                for p in facts.probes]
        out += markdown_table(["probe", "value", "protocol", "seed"], rows)
    else:
        out.append("No probe of this checkpoint is recorded.")
    if facts.other_checkpoint:
        out += ["", "Recorded for another checkpoint of the run, so not shown: " + "; ".join(facts.other_checkpoint)
                + "."]
    return "\n".join(out)


def _sinks(facts: Facts) -> str:
    s = facts.summary
    if s is None:
        return "This checkpoint has no sink diagnosis yet (see the missing results below)."
    shape, spi = s.get("shape", {}), s["sinks_per_image"]
    locations = list(next(iter(spi.values())).keys())
    rows = [[name, *(f"{spi[name][loc]:.2f}" for loc in locations)] for name in [*CLASSES, "all"] if name in spi]
    out = [f"Sinks per image, by class and by where the sink sits (`{facts.summary_file}`: {shape.get('images', '?')} "
           f"validation images, protocol `{s.get('protocol', '?')}`):", "",
           *markdown_table(["class \\ sink on", *locations], rows), "", f"Rule: {describe_rule(s.get('rule'))}."]
    measured = [(c.label, v, c.fmt) for m in MITIGATIONS.values() for c in m.columns
                if (v := m.leaderboard_values(s).get(c.key)) is not None]
    if measured:
        out += ["", "Mechanism, mean over the blocks: " + "; ".join(f"{label} {number(v, fmt)}"
                                                               for label, v, fmt in measured) + "."]
    return "\n".join(out)


def _notes(facts: Facts) -> str:
    if not facts.notes:
        return ("Trained with the reference's recipe (`recipe=paper`): every setting it sets is the recipe's.")
    return "\n".join([
        "Where this run's settings differ from the reference's recipe (`recipe=paper`, the gate x register sweep's "
        "protocol; vitsinks' `docs/fidelity.md` says what each default changes and why):", "",
        *markdown_table(["setting", "this run", "the reference's recipe"],
                        [[f"`{k}`", f"`{v}`", f"`{p}`"] for k, v, p in facts.notes])])


def _files(export: Export) -> str:
    if export.timm:
        kbias = (" The qkv bias is stored without its key part (NaFlexVit has none: it adds the same number to every "
                 "score of a query, which softmax ignores), and [CLS]'s position is added to the token."
                 if export.layout == NAFLEX else "")
        weights = (f"the backbone in timm's `{TIMM_MODELS[export.layout]}` layout (builder "
                   f"`{export.architecture}`).{kbias}")
        check = (f"\n\nExport check: timm's `forward_features` and vitsinks' on {export.check_images} seeded random "
                 f"images differ by at most {export.max_diff:.3g} (float32).")
    else:
        weights = ("the backbone in vitsinks' own layout; timm cannot build it from a config: "
                   + "; ".join(export.reasons) + ".")
        check = ""
    return (f"- `model.safetensors`: {weights}\n- `config.json`: "
            + ("timm's config (`architecture`, `model_args`, `pretrained_cfg`) and " if export.timm else
               "the preprocessing (`pretrained_cfg`) and ")
            + "vitsinks' model config and source (key `vitsinks`), from which vitsinks rebuilds the model." + check)


def _missing(facts: Facts) -> str:
    if not facts.missing:
        return ""
    rows = [[what, f"`{command}`"] for what, command in facts.missing]
    return "\n\n## Missing results\n\n" + "\n".join(markdown_table(["result", "made by"], rows))


def render(facts: Facts, export: Export) -> str:
    """The card's text: front matter, then the sections."""
    training = "\n".join(f"- **{k}**: {f'`{v}`' if k == 'exp' else v}" for k, v in facts.training.items())
    body = "\n\n".join([
        f"# {facts.variant} ViT ({facts.architecture['size']}), trained with vitsinks",
        f"The checkpoint `{facts.checkpoint}` of the vitsinks run `{facts.run}`. vitsinks trains Vision Transformers "
        f"with and without attention-sink mitigations and diagnoses each checkpoint: which heads park their attention "
        f"on one token, and whether that sink is a NOP or a broadcast.",
        "## Load it", _load_lines(export),
        "## The variant", _variant(facts),
        "## Training", training,
        "## Probes", _probes(facts),
        "## Sinks", _sinks(facts),
        "## Model notes", _notes(facts),
        "## Files", _files(export)]) + _missing(facts)
    meta = ModelCardData(library_name="timm" if export.timm else PACKAGE, license=export.license,  # the front matter
                         pipeline_tag=PIPELINE_TAG, tags=[*facts.tags, *(["timm"] if export.timm else [])])
    return str(ModelCard(f"---\n{meta.to_yaml()}\n---\n\n{body}\n"))
