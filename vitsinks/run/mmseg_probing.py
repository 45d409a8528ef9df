"""The dense probe by mmsegmentation (`eval.dense_backend=mmseg`, docs/evaluation.md): the model of any source
(`run.source.for_probes`), frozen, as the backbone of an mmseg config (`probes.mmseg_config`) that mmseg's own
dataset reads ADE20K or VOC for, mmengine's `Runner` trains the head of and mmseg's `IoUMetric` scores
(`probes.mmseg_adapter`). The settings the config leaves to the command are the dinov2 protocol's, with the
`eval.dense_*` overrides; the result is written as the native probe's, `results/dense_<data>_mmseg.json`, its
backend recorded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from torch.utils.data import Dataset, Subset

from vitsinks.backbones import adapt
from vitsinks.data.segmentation import build_seg_dataset, num_seg_classes
from vitsinks.probes.common import limit, write_result
from vitsinks.probes.dense_head import check_size
from vitsinks.probes.dense_protocols import DEFAULT_PROTOCOL, resolve
from vitsinks.probes.features import width
from vitsinks.probes.mmseg_adapter import DATASET_TYPES, MmsegData, train_and_evaluate
from vitsinks.probes.mmseg_config import config_for
from vitsinks.probes.probe_results import MMSEG, DenseResult, dense_kind
from vitsinks.run.source import for_probes
from vitsinks.utils import files
from vitsinks.utils.distributed import rank_world
from vitsinks.utils.errors import ConfigError

LAYOUT_DEPTH = {"ade20k": 2, "voc": 1}  # an image's folder below the layout's root: images/<split>/, JPEGImages/


def layout(ds: Dataset, data: str) -> tuple[Path, list[int] | None]:
    """(the layout folder the native reader found for `ds`: ADEChallengeData2016/ or VOC2012/, the indices of the
    images `ds` keeps; None: all)."""
    whole = ds.dataset if isinstance(ds, Subset) else ds
    first_image = Path(whole.pairs[0][0])  # type: ignore[attr-defined]  # SegFiles: (image, label) pairs
    return first_image.parents[LAYOUT_DEPTH[data]], list(ds.indices) if isinstance(ds, Subset) else None


def mmseg_dense_probe(cfg: DictConfig, data: DictConfig | None = None) -> dict[str, Any]:
    """The dense probe of the model of `cfg` by mmseg (module docstring); writes the JSON, mmseg's log folder and the
    head in the model's run (as `run.probing.dense_probe` does) and returns the result."""
    probing = for_probes(cfg, data)
    data, seed, e = probing.data, probing.seed, cfg.eval
    name = str(data.name)
    if name not in DATASET_TYPES:
        raise ConfigError(f"eval.dense_backend=mmseg reads data=ade20k or data=voc with mmseg's own datasets, not "
                          f"data={name}: probe it with eval.dense_backend=native")
    proto, overrides = resolve(e, name)
    if proto.name != DEFAULT_PROTOCOL or e.dense_augment is not None:
        raise ConfigError(f"eval.dense_backend=mmseg trains under eval.dense_protocol={DEFAULT_PROTOCOL} (its "
                          f"augmentation is the config's train_pipeline, without eval.dense_augment), not "
                          f"eval.dense_protocol={proto.name}" + (f" eval.dense_augment={e.dense_augment}"
                                                                 if e.dense_augment is not None else ""))
    if rank_world()[1] > 1:
        raise ConfigError("eval.dense_backend=mmseg runs in one process: start it without torchrun")
    config = config_for(str(e.dense_mmseg_config), name)
    model = probing.model.taking_imagenet()  # mmseg's data preprocessor normalises as ImageNet
    proto = replace(proto, size=proto.size or probing.model.inputs.size[0])
    size: int = proto.size  # type: ignore[assignment]  # set above
    check_size(model, size)
    splits = [limit(build_seg_dataset(data, split, seed), n, cfg.selection.seed)  # the layout checked, as natively
              for split, n in (("train", e.max_train_images), ("val", e.max_val_images))]
    (root, train_indices), (_, val_indices) = (layout(ds, name) for ds in splits)
    classes = num_seg_classes(splits[0])
    bound = {"size": size, "width": width(model), "depth": len(adapt(model).blocks), "classes": classes,
             "data_root": str(root), "workers": int(data.num_workers), "epochs": proto.epochs, "lr": proto.lr,
             "weight_decay": proto.weight_decay, "batch_size": proto.batch_size}
    run = probing.results()
    kind = dense_kind(name, proto.name, MMSEG)
    out = train_and_evaluate(model, MmsegData(name, root, bool(data.get("voc_aug")), train_indices, val_indices),
                             config, bound, run.results / kind, seed)
    details = {"checkpoint": probing.model.source.recorded, "data": name, "classes": classes, "seed": seed,
               "mmseg_config": str(e.dense_mmseg_config), "mmseg_config_file": str(config), "settings": bound,
               "overrides": overrides, "pixel_acc": out["pixel_acc"], "per_class_iou": out["per_class_iou"],
               "class_names": out["class_names"], "mmseg_metrics": out["mmseg_metrics"],
               "train_images": out["train_images"], "val_images": out["val_images"], "epochs": proto.epochs}
    typed = DenseResult(out["mIoU"], proto.name, details, backend=MMSEG)
    path = run.result(kind)
    write_result(path, typed)
    files.torch_save({"heads": [out["head"]], "classes": classes, "protocol": proto.name, "backend": MMSEG,
                      "mmseg_config": str(config)}, run.results / f"{kind}_head.pt")
    changed = f"; overrides {overrides}" if overrides else ""
    print(f"dense probe ({proto.name}, mmseg {e.dense_mmseg_config}) on {name}: mIoU {out['mIoU'] * 100:.2f}, pixel "
          f"acc {out['pixel_acc'] * 100:.2f} (mmseg's IoUMetric; its log in {run.results / kind}){changed}; {path}")
    return typed.to_json()
