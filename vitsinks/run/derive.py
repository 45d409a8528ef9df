"""A derived run: a model (a run's checkpoint, an import, or a hub model) with a post-hoc edit, laid out as a run
(`<runs_dir>/<source run>+<method>/`, a hub model's under `<runs_dir>/trainfree/`) so that every command reads it.
Its `last.pt` holds the source's weights and the fitted state (a hub model's: the state alone). The edit is fitted on
the first `trainfree.fit_images` TRAIN images of the source's data, never the validation images reported on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import DictConfig, OmegaConf

import vitsinks.quant  # noqa: F401 - registers W8A8 (a quantized source is named as such)
from vitsinks.configs.cli import data_overrides, pick_data
from vitsinks.configs.upgrade import saved, upgrade
from vitsinks.data import build_dataset
from vitsinks.data.selection import fixed_images
from vitsinks.models import SinkViT
from vitsinks.posthoc.method import METHODS
from vitsinks.posthoc.method import method as get_method
from vitsinks.posthoc.resume import keep_or_redo
from vitsinks.pretrained.hub import folder_name
from vitsinks.run.diagnosed import diagnose_checkpoint
from vitsinks.run.pipeline import probes as run_probes
from vitsinks.run.source import HUB_ANALYSES, ModelSource, Opened, open_model, resolve
from vitsinks.run.written import clear_run
from vitsinks.train.checkpoint import save_state
from vitsinks.utils import files
from vitsinks.utils.distributed import resolve_device
from vitsinks.utils.errors import BadValue
from vitsinks.utils.files import TMP_SUFFIX
from vitsinks.utils.rundir import FINAL, RunDir, in_run, model_name


def source_model(cfg: DictConfig) -> Opened:
    """The model `cfg` names (`run.source`), opened; one already edited is refused (post-hoc edits do not stack)."""
    model = open_model(resolve(cfg), cfg)
    method = model.cfg.trainfree.method if model.source.trained else model.source.method
    if method:
        made_of = model.cfg.trainfree.source if model.source.trained else model.source.hub
        raise BadValue(f"{model.source.recorded} is already edited ({method}): derive from its source {made_of} "
                       f"instead (post-hoc edits do not stack)")
    return model


def source_name(path: Path) -> str:
    """What a derived run calls its source checkpoint: `<run>` (`<run>@<stem>` if periodic), or its file's."""
    name = RunDir.of_checkpoint(path).name if in_run(path) else model_name(str(path), "")
    return f"{name}@{path.stem}" if in_run(path) and path.stem != "last" else name


DERIVING = "wait for it to finish, or derive into another runs_dir="  # the way out when another command derives it


def derived_run(cfg: DictConfig, method: str | None = None, source: ModelSource | None = None) -> RunDir:
    """Where `derive` writes the edit `method` of the model of `cfg` (`source`, default resolved). Looks only."""
    m = get_method(str(method or cfg.trainfree.method))
    source = source or resolve(cfg, check=False)
    if source.checkpoint is None:
        return RunDir(Path(cfg.runs_dir) / HUB_ANALYSES / f"{folder_name(str(source.hub))}+{m.name}")
    return RunDir(Path(cfg.runs_dir) / f"{source_name(source.checkpoint)}+{m.name}")


def fit_images(model: Opened | SinkViT, data: DictConfig, seed: int, n: int, selection: Any) -> torch.Tensor:
    """The first `n` readable TRAIN images of `data` in the order of `selection`, as the model's inputs."""
    dataset = build_dataset(data, "train", seed)
    if isinstance(model, Opened):
        return model.pictures(dataset, n, selection, data.on_bad_image, model.inputs.size[0])[0]
    return fixed_images(dataset, n, model.patch_embed.img_size[0], data.on_bad_image, selection)[0]


def on_cpu(obj: Any) -> Any:
    """A fitted state with every tensor on the CPU (a checkpoint loads on any machine)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(on_cpu(v) for v in obj)
    return obj


def derive(cfg: DictConfig, method: str | None = None, settings: Any = None, out: Path | RunDir | None = None,
           overwrite: bool = False) -> RunDir:
    """Fit `method` (default `cfg.trainfree.method`) with `settings` (default: its config group) on the model of
    `cfg` into `out` (default `derived_run`; an old one is replaced with `overwrite`, else refused), under its lock."""
    name = method or cfg.trainfree.method
    if not name:
        raise BadValue(f"name the post-hoc edit: trainfree.method=<name> ({', '.join(sorted(METHODS))})")
    m = get_method(str(name))
    settings = settings if settings is not None else cfg[m.group]
    run = out if isinstance(out, RunDir) else RunDir(out) if out is not None else derived_run(cfg, m.name)
    with run.locked(DERIVING):
        _fit_and_write(cfg, m, settings, run, overwrite)
    return run


def _fit_and_write(cfg: DictConfig, m: Any, settings: Any, run: RunDir, overwrite: bool) -> None:
    """`derive`'s work, under the run's lock."""
    old = [p for p in run.path.iterdir() if p != run.lock_file and not (  # a killed write's temp file: nothing
        p.name.startswith(".") and p.name.endswith(TMP_SUFFIX))] if run.path.is_dir() else []
    if old:
        recorded = upgrade(OmegaConf.load(run.config), str(run.config)) if run.config.is_file() else None
        if recorded is None or not recorded.trainfree.method:
            raise BadValue(f"{run.path} exists already and is not a derived run: move it, or derive into another "
                           f"runs_dir")
        if not overwrite:  # the same edit cut short is derived again; another edit, or a finished one, is kept
            keep_or_redo(run, recorded, m, settings, resolve(cfg).recorded)
    model = source_model(cfg)
    weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}  # before any edit
    data = pick_data(cfg.data, model.cfg.data, data_overrides())
    model.to(resolve_device(cfg.cluster.device))  # the fit's forward passes on the run's device
    with torch.no_grad():
        images = fit_images(model, data, model.cfg.seed, int(settings[m.count_key]), cfg.selection)
        state = on_cpu(m.fit(model.backbone, images, settings))
    # replaced only once the new edit is fitted, its config last: a replacement cut short is still a derived run
    if old:
        clear_run(run)
    model.source.write(model.module)  # a pretrained model's import, which the derived run names as its source
    source, hub = model.source.recorded, model.source.hub
    run_cfg = cast(DictConfig, OmegaConf.merge(  # a DictConfig merged with a mapping
        model.cfg, {"name": run.name, "runs_dir": str(run.path.parent), "data": data, m.group: settings,
                    "selection": cfg.selection, "diagnostics": cfg.diagnostics, "eval": cfg.eval,
                    "cluster": cfg.cluster, "hub": None}))
    run_cfg.trainfree.method, run_cfg.trainfree.source = m.name, source
    run.start(saved(run_cfg))
    if hub is None:
        save_state({"config": saved(run_cfg), "model": weights, "trainfree": state}, run.last)
    else:  # the hub model is loaded again when the run is read: the fitted state alone
        files.torch_save({"config": saved(run_cfg), "hub": hub, "trainfree": state}, run.last)
    run.write_status("running", derived_from=source, method=m.name)  # `finished` once analysed (`working`)


def analyse(run: RunDir, probes: bool = True, diagnose: bool = True) -> dict[str, Any]:
    """The derived run's diagnostics (`diagnostics/final`) and linear and dense probes, as after training."""
    cfg = upgrade(OmegaConf.load(run.config), str(run.config))
    out: dict[str, Any] = {}
    if diagnose:
        out["sinks_per_image"] = diagnose_checkpoint(run.last, cfg, out_dir=run.diagnostics(FINAL))["sinks_per_image"]
    if probes:
        out.update(run_probes(cfg, run.path))
    return out
