"""Quantization robustness of a backbone (docs/quantization.md).

    python -m vitsinks.quantize ckpt=runs/<name>/checkpoints/last.pt
    python -m vitsinks.quantize ckpt=... weight_bits=4 act_bits=8 n_images=128 probes=false
    python -m vitsinks.quantize model.pretrained=<timm name or file> data=imagenet data.root=...

On `quant.n_images` validation images (in the order of `protocol`): the kurtosis and max |x| of the input of every
linear layer of every block, and the change simulated W8A8 (symmetric, per tensor, weights and linear-layer inputs
of the blocks; static ranges calibrated on the first `quant.calib_images` TRAIN images) makes: the cosine of the
final and of every block's tokens to the float model's, the online probe's top-1 (LeJEPA runs) and, with
`quant.probes`, the linear and dense probes' (re-run on the quantized backbone with the images the run's own probes
used; it says which and roughly how long first, and `probes=false` skips them). The quantized model is the derived
run `<run>/quant/w8a8/` (its `status.json`: `finished` once the result is written); the result is
`<run>/results/quant.json`. A
pretrained model is imported as a run first (`run.imported`: `<run>` is `<runs_dir>/<model>/`, and its probes'
changes are measured once its own linear / dense results are there); a loose checkpoint file's `<run>` is
`<runs_dir>/quant/<model>/`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

import vitsinks.quant  # noqa: F401 - registers the w8a8 edit, so the derived checkpoint loads
from vitsinks.configs.cli import cli_keys, data_overrides, hydra_command, pick_data
from vitsinks.data import build_dataset
from vitsinks.diagnostics import fixed_images
from vitsinks.eval.results import DenseResult, LinearResult, probe_seed
from vitsinks.models import SinkViT
from vitsinks.models.weights import load
from vitsinks.objectives.base import Runtime
from vitsinks.objectives.lejepa import online_probe, probe_accuracy
from vitsinks.quant.results import Change, QuantResult, change
from vitsinks.quant.stats import linear_input_stats
from vitsinks.quant.w8a8 import W8A8
from vitsinks.run.imported import with_checkpoint
from vitsinks.train.checkpoint import load_backbone
from vitsinks.trainfree.derive import analyse, derive, source_model
from vitsinks.trainfree.plan import describe
from vitsinks.utils import files
from vitsinks.utils.distributed import resolve_device
from vitsinks.utils.errors import BadValue, NonFinite
from vitsinks.utils.rundir import RunDir, analyses_dir

BATCH = 64  # images per forward pass


def result_run(cfg: DictConfig) -> RunDir:
    """Where the result of checkpoint `cfg.ckpt` goes: its run (`<run>/checkpoints/<stem>.pt`), else
    `<runs_dir>/quant/<model>` (a loose checkpoint file, laid out as a run)."""
    return RunDir(analyses_dir(cfg.ckpt, "quant", cfg.runs_dir))


@torch.no_grad()
def block_outputs(model: SinkViT, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(final normed tokens `forward_features` (B, N, D), every block's output tokens [L x (B, N, D)])."""
    outs: list[torch.Tensor] = []
    handles = [b.register_forward_hook(lambda _m, _i, o: outs.append(o)) for b in model.blocks]
    try:
        final = model.forward_features(images)
    finally:
        for h in handles:
            h.remove()
    return final, outs


def token_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per image, the mean over tokens of the cosine between the token features of `a` and `b` (B, N, D) -> (B,),
    in float64."""
    return F.cosine_similarity(a.double(), b.double(), dim=-1).mean(dim=-1)


@torch.no_grad()
def feature_cosines(fp32: SinkViT, quant: SinkViT, images: torch.Tensor) -> tuple[float, list[float]]:
    """(final-feature cosine, per-block residual-stream cosine): `token_cosine` of the two models' tokens, mean
    over `images`. Non-finite features are a `NonFinite` error."""
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


class _Probed(nn.Module):
    """A backbone with the online probe, shaped as `probe_accuracy` reads a `LeJEPAModel`."""

    def __init__(self, backbone: SinkViT, probe: nn.Module) -> None:
        super().__init__()
        self.backbone, self.probe = backbone, probe


def load_online_probe(ckpt: Path, dim: int) -> nn.Module | None:
    """The online probe (LayerNorm + Linear, `probe.*` in the checkpoint's `model`) of a LeJEPA run's checkpoint;
    None without one."""
    state = load(ckpt)
    sd = {k.removeprefix("probe."): v for k, v in state.get("model", {}).items() if k.startswith("probe.")}
    if not sd:
        return None
    probe = online_probe(dim, int(sd["1.weight"].shape[0]))
    probe.load_state_dict(sd)
    return probe


def online_change(cfg: DictConfig, fp32: SinkViT, quant: SinkViT, device: torch.device) -> Change | None:
    """The online probe's top-1 (%) on the float and on the quantized features, as the run's validation computes
    it (`lejepa.probe_accuracy`, float32); None when `cfg.ckpt` has no probe."""
    probe = load_online_probe(Path(cfg.ckpt), fp32.embed_dim) if cfg.ckpt else None
    if probe is None:
        return None
    probe = probe.to(device)
    val = build_dataset(cfg.data, "val", cfg.seed)
    runtime = Runtime(device)
    return change(*(100 * probe_accuracy(_Probed(m, probe), val, cfg, runtime)  # type: ignore[arg-type]
                    for m in (fp32, quant)))


def source_probes(run: RunDir, ckpt: str | None) -> dict[str, dict[str, Any]]:
    """The source run's linear and dense results of this checkpoint, by kind (results of another checkpoint of
    the run are left out, with a note)."""
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


def eval_overrides() -> list[str] | None:
    """The `eval.*` keys the running command's command line set (without the `eval.` prefix); None outside a
    command (called from Python)."""
    keys = cli_keys()
    return None if keys is None else [k.removeprefix("eval.") for k in keys if k.startswith("eval.")]


def probe_eval(cfg: DictConfig, src: DictConfig, source: dict[str, dict[str, Any]],
               overridden: Sequence[str] | None) -> DictConfig:
    """The eval settings of the quantized run's probes: the source run's own (`src.eval`) with the command line's
    `eval.*` keys `overridden` on top (from Python, `overridden` None: `cfg.eval`), and the images the source's
    probes used (`max_train_images` / `max_val_images`: the largest counts they record, so that each probe sees its
    split as it did)."""
    ev = cfg.eval if overridden is None else OmegaConf.merge(src.eval, {k: OmegaConf.select(cfg.eval, k)
                                                                        for k in overridden})
    counts = {split: [r[f"{split}_images"] for r in source.values() if r.get(f"{split}_images")]
              for split in ("train", "val")}
    return OmegaConf.merge(ev, {f"max_{s}_images": max(c) for s, c in counts.items() if c})  # type: ignore


def probe_changes(run: RunDir, source: dict[str, dict[str, Any]]) -> tuple[Change | None, dict[str, Change]]:
    """(linear top-1 change, dense mIoU changes by kind), in %, of the quantized run `run` against the source's
    results; a probe whose images differ from the source's is left out with a note."""
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
    """Run the analysis (module docstring) on `cfg.ckpt` or `cfg.model`; write and return the result and its path."""
    if not cfg.ckpt and not cfg.model.pretrained:
        raise BadValue("name the model to quantize: ckpt=runs/<name>/checkpoints/last.pt or "
                       "model.pretrained=<timm name or file>")
    cfg = with_checkpoint(cfg)  # a pretrained model: its imported run's checkpoint
    model, src, _ = source_model(cfg)
    out = result_run(cfg)  # before any work: a folder that holds another model's result is refused
    with RunDir(out.quantized(W8A8.name)).locked(QUANTIZING) as derived:  # one writer of this result
        return _quantize(cfg, model, src, out, derived)


QUANTIZING = "wait for it to finish: another quantize of this checkpoint writes the same result"


def _quantize(cfg: DictConfig, model: SinkViT, src: DictConfig, out: RunDir,
              derived_dir: RunDir) -> tuple[QuantResult, Path]:
    """`quantize`'s work, under the lock of its derived run `derived_dir`."""
    q = cfg.quant
    data = pick_data(cfg.data, src.data, data_overrides())
    run_cfg = OmegaConf.merge(src, {"data": data, "protocol": cfg.protocol, "ckpt": cfg.ckpt})
    device = resolve_device(cfg.cluster.device)
    model = model.to(device).eval()
    images, _, _ = fixed_images(build_dataset(data, "val", src.seed), q.n_images, model.patch_embed.img_size[0],
                                data.on_bad_image, cfg.protocol)
    by_block = linear_input_stats(model, images, BATCH)

    source = source_probes(out, cfg.ckpt) if q.probes else {}
    derive_cfg = OmegaConf.merge(cfg, {"eval": probe_eval(cfg, src, source, eval_overrides())})
    derived = derive(derive_cfg, method=W8A8.name, settings=q, out=derived_dir,
                     overwrite=True)  # the quantized copy belongs to this command's result, replaced with it
    with derived.working():  # `finished` once the result is written
        return measure(cfg, derived, model, images, by_block, source, run_cfg, out.result(QuantResult.kind))


def measure(cfg: DictConfig, derived: RunDir, model: SinkViT, images: torch.Tensor,
            by_block: dict[str, dict[str, list[float | None]]],
            source: dict[str, dict[str, Any]], run_cfg: DictConfig, path: Path) -> tuple[QuantResult, Path]:
    """The changes the quantized run `derived` makes against the float `model` on `images` (and, with `source`,
    in the source's probes); the result written to `path`."""
    device = next(model.parameters()).device
    quant, derived_cfg = load_backbone(derived.last)
    quant = quant.to(device).eval()
    if source:
        print(describe(derived_cfg, quant, "probes=false"), flush=True)
    cosine, by_block_cosine = feature_cosines(model, quant, images)
    online = online_change(run_cfg, model, quant, device)
    linear, dense = None, {}
    if source:
        # no diagnostics of the quantized model: its fake-quant rounding flips on float32 noise between the fused
        # forward and the explicit recomputation, which the diagnostics' recompute check rightly refuses
        analyse(derived, probes=True, diagnose=False)
        linear, dense = probe_changes(derived, source)
    elif cfg.quant.probes:
        print("note: the source has no linear or dense results of this checkpoint: the probes were not re-run")
    state = load(derived.last)["trainfree"]
    result = QuantResult(checkpoint=str(cfg.ckpt), weight_bits=int(state["weight_bits"]),
                         act_bits=int(state["act_bits"]), calib_images=int(state["calib_images"]),
                         n_images=len(images), by_block=by_block, feature_cosine=cosine,
                         feature_cosine_by_block=by_block_cosine, online_top1=online, linear_top1=linear,
                         dense=dense)
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
