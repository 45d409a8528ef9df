"""Checkpoints: the one loader (training state, backbone, resume candidates), the atomic writer that refuses
non-finite weights, the check that a checkpoint fits the run, and the classifier stored beside a backbone. A derived
run's edit is put back by the `reapply` function the caller passes (`vitsinks.posthoc.reapply`: it sits above)."""

from __future__ import annotations

import dataclasses
import os
import random
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from vitsinks.configs.upgrade import upgrade
from vitsinks.models import MITIGATIONS, SinkViT, arch_keys, model_from_config, variant_name
from vitsinks.models.kinds import DEFAULT_KIND, KINDS
from vitsinks.models.weights import backbone_state, check_finite, load, non_finite  # noqa: F401 - re-exported
from vitsinks.objectives.lejepa import online_probe
from vitsinks.utils import files
from vitsinks.utils.distributed import gather_objects
from vitsinks.utils.errors import BadValue, InputNotFound, NonFinite
from vitsinks.utils.rundir import RunDir
from vitsinks.utils.safeload import UnsafeFile

# Every `ModelConfig` field that shapes the architecture (field metadata `arch=False` marks the others).
ARCH_KEYS = arch_keys()


class CheckpointMismatch(BadValue):
    """A checkpoint was written by a run of another variant or architecture."""


def save_state(state: dict[str, Any], path: Path) -> None:
    """Write a training state atomically; non-finite model weights are refused (`NonFinite`)."""
    check_finite(state["model"], f"the model about to be saved to {path}")
    files.torch_save(state, path)


def rng_state() -> dict[str, Any]:
    """This process's global RNGs: python, numpy, torch CPU and, with CUDA, its current GPU's."""
    state = {"python": random.getstate(), "numpy": _numpy_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def numpy_state(legacy: tuple[Any, ...]) -> dict[str, Any]:
    """numpy's random state tuple as tensors and numbers, so that a checkpoint loads weights-only."""
    name, key, pos, has_gauss, gauss = legacy
    return {"name": str(name), "key": torch.from_numpy(np.asarray(key).astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}


def _numpy_state() -> dict[str, Any]:
    # the legacy tuple (get_state's default); numpy's stubs type the default call as legacy=False
    return numpy_state(cast(tuple[Any, ...], np.random.get_state()))


def _set_numpy_state(state: dict[str, Any]) -> None:
    """Restore `_numpy_state()`'s generator."""
    key = state["key"].numpy().astype(np.uint32)
    np.random.set_state((state["name"], key, state["pos"], state["has_gauss"], state["gauss"]))


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()`'s generators (CUDA's on the current GPU, when both sides have one)."""
    random.setstate(state["python"])
    _set_numpy_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, (list, tuple)):  # older checkpoints: every visible GPU's state
            index = torch.cuda.current_device()
            if index < len(cuda):
                torch.cuda.set_rng_state(cuda[index])
        else:
            torch.cuda.set_rng_state(cuda)


def rng_states_by_rank() -> list[dict[str, Any]]:
    """Every rank's `rng_state()`, indexed by rank (a collective: every rank calls it; one entry in one process)."""
    return gather_objects(rng_state())


def restore_rng(state: dict[str, Any], rank: int, world: int, fallback_seed: int) -> str | None:
    """Restore this rank's generators from the checkpoint (else seed them with `fallback_seed`); returns the note
    to print when the checkpoint's ranks do not match this run's."""
    saved = state.get("rng_by_rank")
    if saved is None:
        saved, origin = ([state["rng"]] if "rng" in state else []), "a checkpoint with rank 0's random state only"
    else:
        origin = f"a checkpoint written by {len(saved)} rank(s)"
    if rank < len(saved):
        set_rng_state(saved[rank])
    else:
        random.seed(fallback_seed)
        np.random.seed(fallback_seed)
        torch.manual_seed(fallback_seed)  # CUDA's generators too
    if len(saved) == world:
        return None
    kept = min(len(saved), world)
    parts = [f"{_ranks(0, kept)} restored {'its' if kept == 1 else 'their'} own random state"] if kept else []
    if world > kept:
        parts.append(f"{_ranks(kept, world)} started new streams seeded by step and rank")
    if len(saved) > world:
        parts.append(f"the states of the checkpoint's {_ranks(world, len(saved))} were dropped")
    return (f"note: resumed {origin} on {world} rank(s): {', '.join(parts)} (training goes on, not bitwise as with "
            f"the same ranks)")


def _ranks(lo: int, hi: int) -> str:
    """`rank 3` or `ranks 3-7` (lo to hi - 1)."""
    return f"rank {lo}" if hi - lo == 1 else f"ranks {lo}-{hi - 1}"


Reapply = Callable[[SinkViT, str, dict[str, Any]], SinkViT]  # (model, method name, fitted state) -> the edited model


def backbone_from_state(state: dict[str, Any], path: Path,
                        reapply: Reapply | None = None) -> tuple[SinkViT, DictConfig]:
    """The backbone and run config of a loaded checkpoint (`path` names it in errors): non-finite weights are refused,
    and so is a derived run without `reapply` (which puts its edit back)."""
    if not isinstance(state, dict) or "config" not in state or "model" not in state:
        raise BadValue(f"{path} is not a vitsinks training checkpoint (no config/model inside): pass "
                       f"runs/<name>/checkpoints/last.pt, or model.pretrained=<file> for a plain state dict")
    cfg = upgrade(state["config"], f"the config of checkpoint {path}")
    model = model_from_config(OmegaConf.merge(cfg.model, {"pretrained": None}))
    sd = backbone_state(state["model"])
    check_finite(sd, f"checkpoint {path}")
    model.load_state_dict(sd)
    if cfg.trainfree.method:  # a derived run (vitsinks.trainfree): the post-hoc edit goes back on
        if "trainfree" not in state:
            raise BadValue(f"{path} names the post-hoc edit {cfg.trainfree.method} but holds no fitted state: "
                           f"derive it again (python -m vitsinks.trainfree)")
        if reapply is None:
            raise BadValue(f"{path} is a derived run ({cfg.trainfree.method} of {cfg.trainfree.source}): read it "
                           f"through a command (ckpt=...) or vitsinks.run.source.open_model, which put its edit back")
        model = reapply(model, str(cfg.trainfree.method), state["trainfree"])
    return model, cfg


def load_backbone(path: str | Path, reapply: Reapply | None = None) -> tuple[SinkViT, DictConfig]:
    """The backbone of a vitsinks checkpoint file (`backbone_from_state`)."""
    path = Path(path)
    if not path.is_file():
        raise InputNotFound(f"checkpoint {path} not found")
    return backbone_from_state(load(path), path, reapply)


def classifier_from_state(state: dict[str, torch.Tensor]) -> nn.Module | None:
    """The online probe or supervised head in a checkpoint's `model` state; None when it has neither."""
    if "probe.1.weight" in state:
        classes, dim = state["probe.1.weight"].shape
        module: nn.Module = online_probe(dim, classes)
        prefix = "probe."
    elif "head.weight" in state:
        classes, dim = state["head.weight"].shape
        module, prefix = nn.Linear(dim, classes), "head."
    else:
        return None
    module.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    return module


WEIGHTS_ONLY = "weights_only"  # the key that marks a weights-only snapshot


def weights_only(state: dict[str, Any]) -> dict[str, Any]:
    """The `train.periodic_weights_only` snapshot: weights, config, progress, variant, marked `weights_only`."""
    return {"model": state["model"], "config": state["config"], "progress": state["progress"],
            "variant": state["variant"], WEIGHTS_ONLY: True}


def link_or_copy(src: Path, dst: Path) -> None:
    """`dst` with the bytes of `src`, atomically: a hard link where possible, else a copy."""
    tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(6)}{files.TMP_SUFFIX}")
    try:
        try:
            os.link(src, tmp)
        except OSError:  # no hard links here (some network or FUSE file systems)
            with src.open("rb") as fin, tmp.open("wb") as fout:
                shutil.copyfileobj(fin, fout, 16 << 20)
                fout.flush()
                os.fsync(fout.fileno())
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save(run: RunDir, state: dict[str, Any], step: int, periodic: bool, snapshot_weights_only: bool = False) -> None:
    """`last.pt` of `run` and, when `periodic`, `step_XXXXXXX.pt`; refuses non-finite weights (`NonFinite`)."""
    save_state(state, run.last)
    if periodic:
        if snapshot_weights_only:
            files.torch_save(weights_only(state), run.step_checkpoint(step))  # the weights were checked above
        else:
            link_or_copy(run.last, run.step_checkpoint(step))


def load_for_resume(run: RunDir) -> tuple[Path, dict[str, Any]] | None:
    """(path, state) of the newest usable checkpoint, or None without any; `BadValue` when none is usable."""
    notes: list[str] = []
    unsafe: UnsafeFile | None = None
    candidates = run.resume_candidates()
    for path in candidates:
        try:
            state = load(path)
            if not isinstance(state, dict) or not {"model", "progress", "config"} <= set(state):
                raise BadValue(f"{path} is not a vitsinks training checkpoint")
            if state.get(WEIGHTS_ONLY):
                raise BadValue(f"{path}, a weights-only snapshot (train.periodic_weights_only), not a training state")
            check_finite(state["model"], str(path))
        except (BadValue, NonFinite) as err:
            if isinstance(err, UnsafeFile):
                unsafe = unsafe or err
                notes.append(f"{path}, which holds Python objects beyond tensors")
            else:
                notes.append(str(err).split(":")[0])
            continue
        if run.is_main:
            for note in notes:
                print(f"warning: passed over {note}", flush=True)
        return path, state
    if unsafe is not None:  # e.g. a run of an earlier vitsinks: converting its checkpoints makes it resumable
        raise unsafe
    if candidates:
        raise BadValue(f"no usable checkpoint in {run.ckpt_dir} ({'; '.join(notes)}): nothing was overwritten; delete "
                       f"the folder to start over, or pick another run name (name=...)")
    return None


def describe(model_cfg: dict[str, Any]) -> str:
    """`<variant> <size> (dim .., depth ..)` of a model config, for messages."""
    return (f"{variant_name(model_cfg)} {model_cfg['size']} (dim {model_cfg.get('embed_dim') or 'default'}, "
            f"depth {model_cfg.get('depth') or 'default'})")


def _arch(model_cfg: dict[str, Any]) -> dict[str, Any]:
    """Architecture fields of a complete model config (each mitigation says what of its setting matters)."""
    out = dict(model_cfg)
    for name, m in MITIGATIONS.items():
        out[name] = m.arch(out[name])
    attn = str(out.get("attn") or DEFAULT_KIND)
    if attn in KINDS:  # every setting, defaults filled: {} and the defaults written out are one architecture
        out["kind_settings"] = dataclasses.asdict(KINDS[attn].settings(out.get("kind_settings")))
    return out


def arch_of(model_cfg: dict[str, Any]) -> dict[str, Any]:
    """The architecture fields (`ARCH_KEYS`) of a complete model config, as `check_compatible` compares them."""
    arch = _arch(model_cfg)
    return {k: arch.get(k) for k in ARCH_KEYS}


# Beside the architecture, the fields that give the run's other modules their shapes (probe and head sizes).
STATE_KEYS = (("data", "name"), ("data", "num_classes"), ("objective", "name"), ("objective", "proj_hidden"),
              ("objective", "proj_out"), ("objective", "proj_layers"))


def check_compatible(ckpt_cfg: dict[str, Any], run_cfg: dict[str, Any], path: Path) -> None:
    """Raise `CheckpointMismatch` when a checkpoint's run config differs from this run's in a field of its shape."""
    ckpt_cfg = OmegaConf.to_container(upgrade(ckpt_cfg, str(path)), resolve=True, enum_to_str=True)  # type: ignore
    ckpt_model, run_model = _arch(ckpt_cfg["model"]), _arch(run_cfg["model"])
    diff = [(k, ckpt_model.get(k), run_model.get(k)) for k in ARCH_KEYS if ckpt_model.get(k) != run_model.get(k)]
    diff += [(f"{a}.{b}", ckpt_cfg[a][b], run_cfg.get(a, {}).get(b)) for a, b in STATE_KEYS
             if b in ckpt_cfg.get(a, {}) and ckpt_cfg[a][b] != run_cfg.get(a, {}).get(b)]
    if diff:
        fields = ", ".join(f"{k}: {old!r} vs {new!r}" for k, old, new in diff)
        raise CheckpointMismatch(
            f"{path} holds a {describe(ckpt_model)} model trained with other settings than this run's "
            f"{describe(run_model)} ({fields}). Nothing was overwritten: pick another run name (name=...) or "
            f"runs_dir, or relaunch with the checkpoint's settings."
        )
