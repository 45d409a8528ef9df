"""The linear (with the k-NN) and dense probes of any model (`run.source`), as `python -m vitsinks.eval.linear` /
`vitsinks.eval.dense` run them and as a run gets them after training (`run.pipeline.probes`): the model opened for
the probes (`run.source.for_probes`), its features extracted once and cached (`eval.features`), the heads trained
and evaluated (`eval.linear_grid`, `eval.dense_head`; the k-NN vote, `probes.knn_probe`) and the results written in
the model's run."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from omegaconf import DictConfig
from torch.utils.data import Dataset

from vitsinks.data import build_dataset, num_classes
from vitsinks.data.segmentation import build_seg_dataset, num_seg_classes, resize_label, to_input
from vitsinks.probes.common import limit, write_result
from vitsinks.probes.dense_head import (
    DenseHead,
    augmented_batches,
    check_size,
    evaluate,
    evaluate_cached,
    fit,
    mean_per_class,
    plot_examples,
    predict_examples,
)
from vitsinks.probes.dense_protocols import resolve
from vitsinks.probes.features import cache_key, extract, global_features, linear_features, patch_features, width
from vitsinks.probes.knn_probe import knn_scores
from vitsinks.probes.knn_protocols import KNN_PROTOCOLS, KnnProtocol, knn_kind
from vitsinks.probes.linear_grid import train_grid
from vitsinks.probes.linear_protocols import DEFAULT_LINEAR, LINEAR_PROTOCOLS, linear_kind
from vitsinks.probes.metrics import mean_std
from vitsinks.probes.probe_results import MMSEG, NATIVE, DenseResult, KnnResult, LinearResult, dense_kind
from vitsinks.run.mmseg_probing import mmseg_dense_probe
from vitsinks.run.source import Probing, for_probes
from vitsinks.utils import files
from vitsinks.utils.distributed import rank_world
from vitsinks.utils.rundir import RunDir


def linear_probe(cfg: DictConfig, data: DictConfig | None = None) -> dict[str, Any]:
    """The linear probe (`python -m vitsinks.eval.linear`, docs/evaluation.md) of the model of `cfg` (any source,
    `run.source`): extract (or reuse) the features, run the k-NN probe on them (`eval.knn`, `knn_probe`), train the
    grid (`eval.linear_grid`), write `results/linear.json` in the model's run (a pretrained model's: its import,
    `run.imported`; a loose checkpoint file's or a hub model's: `<runs_dir>/quant/<model>`)."""
    probing = for_probes(cfg, data)
    model, data, seed, e = probing.model, probing.data, probing.seed, cfg.eval
    protocol = LINEAR_PROTOCOLS.get(str(e.linear_protocol))
    knn = KNN_PROTOCOLS.get(str(e.knn_protocol)) if e.knn else None
    backbone, device = model.backbone, model.device
    tf = model.inputs.transform(cfg.selection)
    blocks = sorted({min(b, len(backbone.blocks)) for b in e.linear_last_blocks})  # "last 4" of a 2-block model: 2
    n_max, grid = max(blocks), protocol.grid  # grid: the concatenated patches' (`cls+patches`), else 0

    def features(items: list) -> dict[str, torch.Tensor]:
        x = torch.stack([tf(img) for img, _ in items]).to(device)
        if grid:
            cls, pm, patches = linear_features(backbone, x, n_max, grid)
            return {"cls": cls, "patch_mean": pm, "patches": patches, "label": torch.tensor([y for _, y in items])}
        cls, pm = global_features(backbone, x, n_max)
        return {"cls": cls, "patch_mean": pm, "label": torch.tensor([y for _, y in items])}

    datasets = {split: limit(build_dataset(data, split, seed), n, cfg.selection.seed)  # both checked before any work
                for split, n in (("train", e.max_train_images), ("val", e.max_val_images))}
    classes = num_classes(datasets["train"])
    run = probing.results()
    preprocess = "own" if model.inputs.own is not None else f"{cfg.selection.crop_pct}:{cfg.selection.interpolation}"
    splits = {}
    for split, ds in datasets.items():
        key = cache_key(model.source.identity(), data, ds, seed, split=split, size=model.inputs.size[0],
                        n_max=n_max, preprocess=preprocess, **({"patch_grid": grid} if grid else {}))
        splits[split] = extract(ds, features, run.eval_cache / f"lin-{key}.pt", e.batch_size,
                                f"features ({split})", data.on_bad_image)
    if knn is not None:
        knn_probe(probing, run, splits, classes, knn)
    cells = train_grid(splits["train"], splits["val"], classes, list(e.linear_lrs), blocks,
                       e.linear_epochs, e.linear_batch_size, seed, protocol)
    result = LinearResult(checkpoint=model.source.recorded, data=data.name, classes=classes,
                          train_images=len(splits["train"]["label"]), val_images=len(splits["val"]["label"]),
                          seed=seed, best=cells[0], grid=cells,
                          protocol=None if protocol.name == DEFAULT_LINEAR else protocol.name)
    path = run.result(linear_kind(protocol.name))
    write_result(path, result)
    best = cells[0]
    if rank_world()[0] == 0:
        print(f"linear probe on {data.name}: top-1 {best['top1']:.2f} (lr {best['lr']}, last {best['n_last']} blocks, "
              f"{best['pool']}); {path}")
    return result.to_json()


def knn_probe(probing: Probing, run: RunDir, splits: dict[str, dict[str, torch.Tensor]], classes: int,
              protocol: KnnProtocol) -> KnnResult:
    """The k-NN probe (docs/evaluation.md) under `protocol` on the linear probe's cached features `splits` (`train`
    and `val`, `linear_probe`), on the model's device: write `results/knn[_<protocol>].json` in `run`."""
    by_k = knn_scores(splits["train"], splits["val"], classes, protocol, probing.model.device)
    top1 = next(s["top1"] for s in by_k if s["k"] == protocol.k)
    result = KnnResult(top1, protocol.k, by_k, protocol.name, protocol.feature, protocol.temperature,
                       probing.model.source.recorded, probing.data.name, classes, len(splits["train"]["label"]),
                       len(splits["val"]["label"]), probing.seed)
    path = run.result(knn_kind(protocol.name))
    write_result(path, result)
    if rank_world()[0] == 0:
        shown = ", ".join(f"k={s['k']} {s['top1']:.2f}" for s in by_k)
        print(f"k-NN probe ({protocol.name}) on {probing.data.name}: top-1 {top1:.2f} (k={protocol.k}; {shown}); "
              f"{path}")
    return result


def dense_probe(cfg: DictConfig, data: DictConfig | None = None) -> dict[str, Any]:
    """The dense probe(s) of `eval.dense_protocol` (`python -m vitsinks.eval.dense`, docs/evaluation.md) of the model
    of `cfg` (any source, `run.source`): train and evaluate them (`eval.dense_head`); write the JSON, the heads and
    the PNG in the model's run (a pretrained model's: its import, `run.imported`; a loose checkpoint file's or a hub
    model's: `<runs_dir>/quant/<model>`). `eval.dense_backend=mmseg`: mmsegmentation's (`run.mmseg_probing`)."""
    if str(cfg.eval.get("dense_backend", NATIVE)) == MMSEG:
        return mmseg_dense_probe(cfg, data)
    probing = for_probes(cfg, data)
    data, seed, e = probing.data, probing.seed, cfg.eval
    model = probing.model.taking_imagenet()  # the probe's inputs are ImageNet-normalised (`to_input`)
    proto, overrides = resolve(e, str(data.name))
    size: int = proto.size or probing.model.inputs.size[0]
    proto = replace(proto, size=size)
    check_size(model, size)
    device = probing.model.device
    train_ds, val_ds = (limit(build_seg_dataset(data, split, seed, proto.voc_background), n, cfg.selection.seed)
                        for split, n in (("train", e.max_train_images), ("val", e.max_val_images)))
    classes = num_seg_classes(train_ds)
    run = probing.results()

    def featurize(items: list) -> dict[str, torch.Tensor]:
        x = torch.stack([to_input(img, size) for img, _ in items]).to(device)
        labels = torch.stack([resize_label(lb, size) for _, lb in items])  # 0..254 and IGNORE (255): uint8 cached
        return {"feats": patch_features(model, x), "label": labels.to(torch.uint8)}

    def cached(split: str, ds: Dataset) -> dict[str, torch.Tensor]:
        key = cache_key(probing.model.source.identity(), data, ds, seed, split=split, size=size)
        return extract(ds, featurize, run.eval_cache / f"dense-{key}.pt", e.batch_size,
                       f"dense features ({split})", data.on_bad_image)

    if proto.augment:
        n, batch = len(train_ds), augmented_batches(model, train_ds, proto, data.on_bad_image)  # type: ignore
    else:
        train = cached("train", train_ds)
        n = len(train["label"])  # unreadable images left out

        def batch(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return train["feats"][idx].float().to(device), train["label"][idx].long()

    if proto.val == "resize":
        val = cached("val", val_ds)
        val_images = len(val["label"])

        def evaluate_head(head: DenseHead) -> dict[str, Any]:
            return evaluate_cached(head, val, classes, proto.batch_size, proto.miou_classes)
    else:
        val_images = len(val_ds)  # type: ignore[arg-type]

        def evaluate_head(head: DenseHead) -> dict[str, Any]:
            return evaluate(model, head, val_ds, classes, size, data.on_bad_image, proto.miou_classes)

    probes, heads = [], []
    for k in range(proto.probe_seeds):
        torch.manual_seed(seed + k)  # the head's init and the augmentations: the same command, the same mIoU
        heads.append(DenseHead(width(model), classes, proto.batchnorm).to(device))
        probes.append(fit(heads[-1], batch, n, proto, seed + k, evaluate_head))
    miou, std = mean_std([p["mIoU"] for p in probes])
    details = {"checkpoint": probing.model.source.recorded, "data": data.name, "classes": classes, "seed": seed,
               "protocol_settings": proto.settings(), "overrides": overrides, "mIoU_std": std,
               "pixel_acc": mean_std([p["pixel_acc"] for p in probes])[0],
               "per_class_iou": mean_per_class([p["per_class_iou"] for p in probes]), "probes": probes,
               "train_images": len(train_ds), "val_images": val_images,  # type: ignore[arg-type]
               "epochs": proto.epochs, "augment": proto.augment}
    typed = DenseResult(miou, proto.name, details)
    result = typed.to_json()
    kind = dense_kind(data.name, proto.name)
    path = run.result(kind)
    write_result(path, typed)
    if rank_world()[0] != 0:
        return result
    files.torch_save({"heads": [h.state_dict() for h in heads], "classes": classes, "protocol": proto.name},
                     run.results / f"{kind}_head.pt")
    shown = predict_examples(model, heads[0], val_ds, proto, e.dense_examples, data.on_bad_image)
    if shown:
        plot_examples(shown, classes, run.results / f"{kind}.png",
                      f"dense probe ({proto.name}) on {data.name}: mIoU {miou * 100:.1f}")
    spread = f" ± {std * 100:.2f} over {len(probes)} probe seeds" if len(probes) > 1 else ""
    best = f", best of val before and after each of {proto.epochs} epochs" if proto.best_over_epochs else ""
    changed = f"; overrides {overrides}" if overrides else ""
    print(f"dense probe ({proto.name}) on {data.name}: mIoU {miou * 100:.2f}{spread}{best}, pixel acc "
          f"{result['pixel_acc'] * 100:.2f}{changed}; {path}")
    return result
