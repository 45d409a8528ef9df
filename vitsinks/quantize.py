"""Quantization robustness of a backbone (docs/quantization.md).

    python -m vitsinks.quantize ckpt=runs/<name>/checkpoints/last.pt
    python -m vitsinks.quantize ckpt=... weight_bits=4 act_bits=8 n_images=128 probes=false
    python -m vitsinks.quantize model.pretrained=<timm name or file> data=imagenet data.root=...
    python -m vitsinks.quantize hub=hf:facebook/dinov2-small data=imagenet data.root=...

The model is any source a command takes (`ckpt=`, `run=`, `model.pretrained=`, `hub=`; not an edited one). On
`quant.n_images` validation images: the kurtosis and max |x| of every linear layer's input in the blocks, and what
simulated W8A8 (calibrated on `quant.calib_images` TRAIN images) changes: the cosine of the final and of every block's
tokens to the float model's, the online probe's top-1 and, with `quant.probes`, the linear and dense probes'. Writes
the derived run `<run>/quant/w8a8/` and `<run>/results/quant.json` (a loose checkpoint file's or a hub model's
`<run>`: `<runs_dir>/quant/<model>/`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

import vitsinks.quant  # noqa: F401 - registers the w8a8 edit, so the derived checkpoint loads
from vitsinks.configs.cli import cli_keys, data_overrides, hydra_command, pick_data
from vitsinks.data import build_dataset
from vitsinks.models import SinkViT
from vitsinks.models.seam import Backbone
from vitsinks.models.weights import load
from vitsinks.objectives.lejepa import probe_top1
from vitsinks.objectives.monitors import embed, probe_batches
from vitsinks.objectives.objective import Runtime
from vitsinks.posthoc.plan import describe
from vitsinks.probes.probe_results import DenseResult, LinearResult, probe_seed
from vitsinks.quant.outliers import linear_input_stats
from vitsinks.quant.quant_results import Change, QuantResult, change
from vitsinks.quant.w8a8 import W8A8
from vitsinks.run.derive import analyse, derive, source_model
from vitsinks.run.source import Opened, of_checkpoint, open_model, resolve
from vitsinks.train.checkpoint import classifier_from_state
from vitsinks.utils import files
from vitsinks.utils.distributed import resolve_device
from vitsinks.utils.errors import NonFinite
from vitsinks.utils.rundir import RunDir

BATCH = 64  # images per forward pass


@torch.no_grad()
def block_outputs(model: Backbone, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(final normed tokens (B, N, D), every block's output tokens [L x (B, N, D)]), through the seam."""
    x, outs = model.embed_tokens(images), []
    for i in range(len(model.blocks)):
        x = model.block(i, x)
        outs.append(x)
    return model.readout(x), outs


def token_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per image, the mean over tokens of the float64 cosine of the token features of `a` and `b`: (B, N, D) -> (B,)."""
    return F.cosine_similarity(a.double(), b.double(), dim=-1).mean(dim=-1)


@torch.no_grad()
def feature_cosines(fp32: Backbone, quant: Backbone, images: torch.Tensor) -> tuple[float, list[float]]:
    """(final-feature cosine, per-block cosines): mean `token_cosine` over `images`; non-finite: `NonFinite`."""
    device = next(fp32.parameters()).device
    final_sum, block_sum = 0.0, torch.zeros(len(fp32.blocks), dtype=torch.float64)
    for lo in range(0, len(images), BATCH):
        x = images[lo : lo + BATCH].to(device)
        (fa, ba), (fb, bb) = block_outputs(fp32, x), block_outputs(quant, x)
        for name, t in (("float", [fa, *ba]), ("quantized", [fb, *bb])):
            if not all(bool(torch.isfinite(v).all()) for v in t):
                raise NonFinite(f"the {name} model's features are not finite: the model diverged, or the "
                                f"quantization grid is too coarse (raise quant.weight_bits / quant.act_bits); "
                                f"nothing was written")
        final_sum += float(token_cosine(fa, fb).sum())
        block_sum += torch.stack([token_cosine(u, v).sum() for u, v in zip(ba, bb, strict=True)]).cpu()
    n = len(images)
    return final_sum / n, (block_sum / n).tolist()


@torch.no_grad()
def online_change(cfg: DictConfig, fp32: SinkViT, quant: SinkViT, device: torch.device) -> Change | None:
    """The online probe's top-1 (%) on the float and quantized features; None without a LeJEPA probe."""
    state = load(Path(cfg.ckpt)).get("model", {}) if cfg.ckpt else {}
    if "probe.1.weight" not in state:
        return None
    probe, runtime = cast(nn.Module, classifier_from_state(state)).to(device).eval(), Runtime(device)
    batches = probe_batches(build_dataset(cfg.data, "val", cfg.seed), cfg)
    return change(*(100 * probe_top1(probe, embed(m.eval(), batches, device, runtime.autocast), runtime)
                    for m in (fp32, quant)))


def source_probes(run: RunDir, ckpt: str | None) -> dict[str, dict[str, Any]]:
    """The source run's linear and dense results of this checkpoint, by kind (another checkpoint's: a note)."""
    if not ckpt:
        return {}
    found = {p.stem: files.read_json(p, reprobe(p, ckpt)) for p in [run.result(LinearResult.kind),
                                                                    *run.results_of("dense_")] if p.is_file()}
    out = {}
    for kind, res in found.items():
        if Path(str(res.get("checkpoint", ckpt))).name == Path(ckpt).name:
            out[kind] = res
        else:
            print(f"note: {run.result(kind)} is of {res['checkpoint']}, not {ckpt}: not compared")
    return out


def reprobe(result: Path, ckpt: str) -> str:
    """The fix for a torn probe result `results/<kind>.json`: the probe command that writes it again."""
    command = "vitsinks.eval.linear" if result.stem == LinearResult.kind else "vitsinks.eval.dense"
    return f"rerun `python -m {command} ckpt={ckpt}`"


def probe_eval(cfg: DictConfig, src: DictConfig, source: dict[str, dict[str, Any]],
               overridden: Sequence[str] | None) -> DictConfig:
    """The probes' eval: `src.eval` with `cfg.eval`'s `overridden` keys (None: `cfg.eval`), the source's counts."""
    ev = cfg.eval if overridden is None else OmegaConf.merge(src.eval, {k: OmegaConf.select(cfg.eval, k)
                                                                        for k in overridden})
    counts = {split: [r[f"{split}_images"] for r in source.values() if r.get(f"{split}_images")]
              for split in ("train", "val")}
    return OmegaConf.merge(ev, {f"max_{s}_images": max(c) for s, c in counts.items() if c})  # type: ignore


def probe_changes(run: RunDir, source: dict[str, dict[str, Any]]) -> tuple[Change | None, dict[str, Change]]:
    """(linear top-1 change, dense mIoU changes by kind), in %, against the source's results."""
    linear, dense = None, {}
    for kind, src_res in source.items():
        path = run.result(kind)
        if not path.is_file():
            continue
        res = files.read_json(path, "rerun the quantization (`python -m vitsinks.quantize`), which probes again")
        if any(res.get(f"{s}_images") != src_res.get(f"{s}_images") for s in ("train", "val")):
            print(f"note: {kind} of the quantized run used other images than the source's: not compared")
            continue
        seeds = probe_seed(res), probe_seed(src_res)
        if None not in seeds and seeds[0] != seeds[1]:
            print(f"note: {kind} of the quantized run has probe seed {seeds[0]}, the source's {seeds[1]}: not compared "
                  f"(probe the source again without seed=)")
            continue
        if kind == LinearResult.kind:
            linear = change(LinearResult.from_json(src_res).best["top1"], LinearResult.from_json(res).best["top1"])
        else:
            dense[kind] = change(100 * DenseResult.from_json(src_res).mIoU, 100 * DenseResult.from_json(res).mIoU)
    return linear, dense


def quantize(cfg: DictConfig) -> tuple[QuantResult, Path]:
    """Run the analysis (module docstring) on the model of `cfg`; write and return the result and its path."""
    source = resolve(cfg)
    source.analyses("quant", cfg.runs_dir, claim=False)  # a folder of another model's: refused before loading
    model = source_model(cfg)  # one already edited is refused
    source.write(model.module)  # a pretrained model's import: the result goes into it
    out = RunDir(source.analyses("quant", cfg.runs_dir))
    with RunDir(out.quantized(W8A8.name)).locked(QUANTIZING) as derived:  # one writer of this result
        return _quantize(cfg, model, out, derived)


QUANTIZING = "wait for it to finish: another quantize of this checkpoint writes the same result"


def _quantize(cfg: DictConfig, model: Opened, out: RunDir, derived_dir: RunDir) -> tuple[QuantResult, Path]:
    """`quantize`'s work, under the lock of its derived run `derived_dir`."""
    q, src, recorded = cfg.quant, model.cfg, model.source.recorded
    data = pick_data(cfg.data, src.data, data_overrides())
    ckpt = recorded if model.source.trained else None  # the online probe is a vitsinks checkpoint's
    run_cfg = cast(DictConfig, OmegaConf.merge(src, {"data": data, "selection": cfg.selection, "ckpt": ckpt}))
    device = model.to(resolve_device(cfg.cluster.device)).device
    images, _, _ = model.pictures(build_dataset(data, "val", src.seed), q.n_images, cfg.selection, data.on_bad_image,
                                  model.inputs.size[0])
    by_block = linear_input_stats(model.backbone, images, BATCH)

    source = source_probes(out, recorded) if q.probes else {}
    keys = cli_keys()  # None outside a command (called from Python)
    overridden = None if keys is None else [k.removeprefix("eval.") for k in keys if k.startswith("eval.")]
    derive_cfg = cast(DictConfig, OmegaConf.merge(cfg, {"eval": probe_eval(cfg, src, source, overridden)}))
    derived = derive(derive_cfg, method=W8A8.name, settings=q, out=derived_dir,
                     overwrite=True)  # the quantized copy belongs to this command's result, replaced with it
    with derived.working():  # `finished` once the result is written
        quant = open_model(of_checkpoint(derived.last), cfg).to(device)
        if source:
            print(describe(quant.cfg, quant.backbone, "probes=false", quant.inputs.size[0]), flush=True)
        cosine, by_block_cosine = feature_cosines(model.backbone, quant.backbone, images)
        online = None  # the online probe is a vitsinks checkpoint's
        if isinstance(model.module, SinkViT) and isinstance(quant.module, SinkViT):
            online = online_change(run_cfg, model.module, quant.module, device)
        if source:
            # no diagnostics of the quantized model: its fake-quant rounding flips on float32 noise between the fused
            # forward and the explicit recomputation, which the diagnostics' recompute check rightly refuses
            analyse(derived, probes=True, diagnose=False)
        elif q.probes:
            print("note: the source has no linear or dense results of this checkpoint: the probes were not re-run")
        linear, dense = probe_changes(derived, source)
        state = load(derived.last)["trainfree"]
        result = QuantResult(checkpoint=recorded, weight_bits=int(state["weight_bits"]),
                             act_bits=int(state["act_bits"]), calib_images=int(state["calib_images"]),
                             n_images=len(images), by_block=by_block, feature_cosine=cosine,
                             feature_cosine_by_block=by_block_cosine, online_top1=online, linear_top1=linear,
                             dense=dense)
        path = out.result(QuantResult.kind)
        files.write_json(path, result.to_json())
        return result, path


def main(cfg: DictConfig) -> None:
    result, path = quantize(cfg)
    print(json.dumps(result.values(), indent=1))
    print(f"W{result.weight_bits}A{result.act_bits}: feature cosine {result.feature_cosine:.4f}; {path}")


cli = hydra_command(main, aliases={k: f"quant.{k}" for k in ("weight_bits", "act_bits", "calib_images", "n_images",
                                                              "probes")})

if __name__ == "__main__":
    cli()
