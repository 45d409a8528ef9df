"""Weights on disk: the one checkpoint reader, the finiteness check, the backbone of any state dict, what
architecture a state dict holds, and timm's hub weights without waiting on a network that is not there."""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import safetensors.torch
import timm
import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

from vitsinks.models.mitigations import MITIGATIONS, BlockMitigation
from vitsinks.utils.errors import BadValue, InputNotFound, NonFinite
from vitsinks.utils.safeload import UnsafeFile, torch_load

Kind = Literal["checkpoint", "weights"]  # a run's checkpoint, or a pretrained weights file (model.pretrained=)
RUN_DIVERGED = "the run diverged; lower train.lr and train from an earlier checkpoint"
DAMAGED = ("the file is damaged or the model diverged where it was trained: download it again or pass other "
           "weights")
HUB_TIMEOUT_S = 3.0  # the connection check before timm's hub download
SAFETENSORS = ".safetensors"
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pth.tar", ".tar", SAFETENSORS)  # of a file, not a timm name


def non_finite(tensors: dict[str, Any]) -> list[str]:
    """Names of the floating-point tensors of a state dict that hold NaN or inf."""
    return [k for k, v in tensors.items() if torch.is_tensor(v) and v.is_floating_point() and
            not bool(torch.isfinite(v).all())]


def check_finite(tensors: dict[str, Any], what: str, fix: str = RUN_DIVERGED) -> None:
    """`NonFinite` naming `what`, the first bad tensors and `fix` when any weight is NaN or inf."""
    bad = non_finite(tensors)
    if bad:
        raise NonFinite(f"{what} holds non-finite weights (NaN or inf) in {len(bad)} tensors, e.g. "
                        f"{', '.join(bad[:3])}: {fix}")


def load(path: Path, kind: Kind = "checkpoint", mmap: bool = False) -> Any:
    """Load a run's checkpoint (`kind="checkpoint"`) or a pretrained weights file (`kind="weights"`: `torch.save` or
    `.safetensors`) on the CPU, never running code the file carries (`utils.safeload`: else an `UnsafeFile`); an
    unreadable file is a `BadValue` naming it with the fix for that kind of file. `mmap`: tensors mapped, not read."""
    path = Path(path)
    safetensors_file = kind == "weights" and path.suffix == SAFETENSORS
    try:
        if safetensors_file:
            return safetensors.torch.load_file(path, device="cpu")
        return torch_load(path, mmap=mmap and _is_torch_archive(path))  # a legacy-format file cannot be mapped
    except UnsafeFile:
        raise
    except Exception as err:  # noqa: BLE001 - any reading failure means the same thing to the user
        torn = safetensors_file or _is_torch_archive(path)  # a safetensors error of any kind: cut or damaged
        if kind == "weights":
            if torn:
                raise BadValue(f"the weights file {path} is truncated or corrupt ({type(err).__name__}): download or "
                               f"save it again") from err
            raise BadValue(f"{path} is not a PyTorch weights file ({type(err).__name__}): pass a state dict saved "
                           f"with torch.save (.pt, .pth, .bin), a {SAFETENSORS} file, or a timm model name") from err
        if torn and path.parent.name == "checkpoints":  # a run's own checkpoint
            raise BadValue(f"cannot read checkpoint {path} ({type(err).__name__}): it is truncated or corrupt; "
                           f"resume from another checkpoint of the run (checkpoints/step_*.pt) or delete it to "
                           f"start over") from err
        if torn:  # a checkpoint file outside a run (copied, downloaded)
            raise BadValue(f"cannot read checkpoint {path} ({type(err).__name__}): it is truncated or corrupt; "
                           f"copy it again from its run (runs/<name>/checkpoints/)") from err
        raise BadValue(f"{path} is not a PyTorch checkpoint ({type(err).__name__}): pass a file written by "
                       f"vitsinks (runs/<name>/checkpoints/*.pt)") from err


def _is_torch_archive(path: Path) -> bool:
    """Whether a file starts like `torch.save`'s zip archive (a truncated one still does)."""
    with Path(path).open("rb") as f:
        return f.read(4) == b"PK\x03\x04"


def backbone_state(obj: dict[str, Any]) -> dict[str, Any]:
    """The backbone's tensors of a model state dict: `backbone.*` keys without the prefix (the LeJEPA and supervised
    wrappers), or the dict itself when it has none."""
    if any(k.startswith("backbone.") for k in obj):
        return {k.removeprefix("backbone."): v for k, v in obj.items() if k.startswith("backbone.")}
    return obj


def state_dict_from_file(path: Path) -> dict[str, torch.Tensor]:
    """A backbone state dict from a pretrained weights file: a plain state dict (`torch.save` or `.safetensors`), a
    {'state_dict'|'model': ...} wrapper, or a vitsinks training checkpoint. Its errors speak of a weights file."""
    obj = load(path, "weights")
    for key in ("model", "state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise BadValue(f"{path} holds a {type(obj).__name__}, not a state dict: pass a state-dict file or checkpoint")
    return backbone_state(obj)


# ---- what a state dict holds ------------------------------------------------------------------------------------

BLOCK = re.compile(r"^blocks\.(\d+)\.")


def architecture(sd: dict[str, Any]) -> dict[str, Any]:
    """The ViT a (timm-layout) state dict holds, read off its keys and shapes: width, depth, heads (where a per-head
    tensor tells), registers, patch size, gate (None, `elementwise`, `headwise`), MLP ratio, LayerScale and whether it
    has each other block mitigation (by its config name). A field a state dict does not show is None."""
    shape = {k: tuple(v.shape) for k, v in sd.items() if torch.is_tensor(v)}
    width = next((s[-1] for k in ("cls_token", "pos_embed", "norm.weight") if (s := shape.get(k))), None)
    blocks = {int(m.group(1)) for k in shape if (m := BLOCK.match(k))}
    proj = shape.get("patch_embed.proj.weight")
    gate = shape.get("blocks.0.attn.gate.weight")
    gate_kind = None if gate is None else "elementwise" if width is None or gate[0] == width else "headwise"
    heads = (gate[0] if gate is not None and gate_kind == "headwise"
             else (shape.get("blocks.0.attn.sink_logit") or (None,))[0])
    fc1 = shape.get("blocks.0.mlp.fc1.weight")
    return {"width": width, "depth": max(blocks) + 1 if blocks else 0, "heads": heads,
            "registers": shape.get("reg_token", (1, 0))[1], "patch": proj[-1] if proj and len(proj) == 4 else None,
            "gate": gate_kind, "mlp": round(fc1[0] / width, 3) if fc1 and width else None,
            "layerscale": "blocks.0.ls1.gamma" in shape,
            **{m.name: any(k.startswith(_state_prefix(m)) for k in shape) for m in OTHER_MITIGATIONS}}


OTHER_MITIGATIONS = tuple(m for m in MITIGATIONS.values() if m.name != "gate")  # the gate's kind is read above


def _has(words: str, v: Any) -> str:
    return words if v else f"no {words}"


def _state_prefix(m: type[BlockMitigation]) -> str:
    """Where a mitigation's parameters sit in block 0's state dict."""
    return f"blocks.0.{'' if m.site == 'update' else 'attn.'}{m.attr}."


# the secondary fields, shown only where the two architectures differ in them
EXTRAS: dict[str, Callable[[Any], str]] = {
    "mlp": lambda v: f"MLP ratio {v:g}" if v else "no MLP",
    "layerscale": lambda v: "LayerScale" if v else "no LayerScale",
    **{m.name: partial(_has, m.name.replace("_", " ")) for m in OTHER_MITIGATIONS},
}


def describe_architecture(arch: dict[str, Any], extras: tuple[str, ...] = ()) -> str:
    """`width 384, depth 12, 6 heads, 4 registers, patch 14, not gated`, then the `extras` fields (`EXTRAS`)."""
    parts = [f"width {arch['width']}", f"depth {arch['depth']}"]
    if arch.get("heads"):
        parts.append(f"{arch['heads']} heads")
    parts += [f"{arch['registers']} registers", f"patch {arch['patch']}",
              f"{arch['gate']}-gated" if arch.get("gate") else "not gated"]
    return ", ".join(parts + [EXTRAS[k](arch.get(k)) for k in extras])


RESET_MODEL = "set model= and model.* to the file's architecture"  # the fix of model.pretrained=


def mismatch(what: str, held: dict[str, Any], asked: dict[str, Any], keys: dict[str, list[str]],
             fix: str = RESET_MODEL) -> str:
    """One line: `what` holds the architecture `held`, not the `asked` one, naming the fields that differ and `fix`;
    when the architectures read the same, the first keys that differ (`keys`, from `key_differences`)."""
    extras = tuple(k for k in EXTRAS if held.get(k) != asked.get(k))
    differ = [k for k in ("width", "depth", "heads", "registers", "patch", "gate", *extras)
              if held.get(k) != asked.get(k) and not (k == "heads" and None in (held.get(k), asked.get(k)))]
    line = (f"{what} holds a ViT of {describe_architecture(held, extras)}; the model asked for has "
            f"{describe_architecture(asked, extras)}")
    if differ:
        return f"{line}: {fix} (it differs in {', '.join(differ)})"
    detail = key_detail(keys)
    return f"{line}, but its tensors do not fit{f' ({detail})' if detail else ''}: pass weights of this architecture"


def key_detail(keys: dict[str, list[str]]) -> str:
    """`2 missing, e.g. head.weight, head.bias; 1 of another shape, e.g. pos_embed` of `key_differences`."""
    return "; ".join(f"{len(names)} {kind}, e.g. {', '.join(names[:2])}" for kind, names in keys.items() if names)


def misfit(what: str, sd: dict[str, Any], own: dict[str, Any], fix: str, heads: int | None = None) -> str:
    """One line for weights `sd` that do not load into a model whose state dict is `own` (`heads`: its heads, when
    known): the two architectures and `fix` (`mismatch`) when both read as timm-layout ViTs, else the keys."""
    held, asked = architecture(sd), {**architecture(own), "heads": heads}
    keys = key_differences(sd, own)
    if held["width"] and asked["width"]:
        return mismatch(what, held, asked, keys, fix)
    return f"{what}: its tensors do not fit the model ({key_detail(keys) or 'of other types'}): {fix}"


def key_differences(sd: dict[str, Any], expected: dict[str, Any]) -> dict[str, list[str]]:
    """The keys of `sd` that `expected` lacks, those it lacks, and those of another shape."""
    return {"unexpected": [k for k in sd if k not in expected], "missing": [k for k in expected if k not in sd],
            "of another shape": [k for k in sd if k in expected and torch.is_tensor(sd[k])
                                 and tuple(sd[k].shape) != tuple(expected[k].shape)]}


# ---- timm's hub ---------------------------------------------------------------------------------------------------

def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the Hugging Face hub (or the proxy for it) opens within `timeout` seconds."""
    url = urlparse(hf_constants.ENDPOINT)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
        url = urlparse(proxy if "://" in proxy else f"http://{proxy}")
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
        socket.create_connection((url.hostname or "", port), timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True


@contextmanager
def hub_offline(on: bool) -> Iterator[None]:
    """huggingface_hub's offline mode (`HF_HUB_OFFLINE`) on within the block when `on`: the cache answers at once."""
    before = hf_constants.HF_HUB_OFFLINE
    hf_constants.HF_HUB_OFFLINE = before or on
    try:
        yield
    finally:
        hf_constants.HF_HUB_OFFLINE = before


def _cache_miss(err: BaseException | None) -> bool:
    """Whether huggingface_hub's offline cache miss is among the causes of `err` (the libraries wrap it)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, LocalEntryNotFoundError | OfflineModeIsEnabled):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


@contextmanager
def hub_or_cache(what: str, fix: str = "pass a weights file") -> Iterator[None]:
    """A library's downloads from the Hugging Face hub within the block, without waiting on a hub that is not there:
    with the hub unreachable (`hub_reachable`) or `HF_HUB_OFFLINE` set, only the local cache is read, and files not
    there are one `BadValue` naming `what` and `fix` within seconds, instead of a minute of retries."""
    told_offline = hf_constants.HF_HUB_OFFLINE
    offline = told_offline or not hub_reachable()
    try:
        with hub_offline(offline):
            yield
    except Exception as err:
        if not (offline and _cache_miss(err)):
            raise
        why = "HF_HUB_OFFLINE is set" if told_offline else f"the hub ({hf_constants.ENDPOINT}) cannot be reached"
        raise BadValue(f"{what}: its weights are not in the local cache ({hf_constants.HF_HUB_CACHE}) and {why}: "
                       f"download them once with the network on, or {fix}") from None


def hub_state_dict(name: str) -> dict[str, torch.Tensor]:
    """The state dict of timm model `name` with its pretrained weights (downloaded, or cached: `hub_or_cache`)."""
    if Path(name).suffix in WEIGHT_SUFFIXES:  # a file meant, not a timm name (whose tags hold no such suffix)
        raise InputNotFound(f"model.pretrained={name}: no such weights file: check the path, or pass a timm name")
    try:
        with hub_or_cache(f"model.pretrained={name}"):
            return timm.create_model(name, pretrained=True, num_classes=0).state_dict()
    except BadValue:
        raise
    except Exception as err:  # noqa: BLE001 - unknown name, missing hub files, a broken download
        raise BadValue(f"model.pretrained={name!r} is neither a file nor a timm model whose weights could be loaded "
                       f"({type(err).__name__}: {' '.join(str(err).split())[:300]}); pass a state-dict path or a "
                       f"timm name with cached weights") from err
