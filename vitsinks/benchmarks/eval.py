"""`python -m vitsinks.bench eval`: a cached dense-probe epoch against a backbone pass, and extraction speed."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from vitsinks.benchmarks.timing import interleaved, ratio_stats, table
from vitsinks.models import SIZES, build_vit
from vitsinks.probes.dense_head import DenseHead
from vitsinks.probes.features import global_features, patch_features


def run(size: str = "vit_cpu", batch: int = 32, repeats: int = 5, images: int = 256) -> str:
    """Return the ratio (target <= 0.1) and the feature-extraction throughput."""
    torch.manual_seed(0)
    spec = SIZES[size]
    model = build_vit(size).eval().requires_grad_(False)
    x = torch.randn(images, 3, spec.img_size, spec.img_size)
    labels = torch.randint(0, 11, (images, spec.img_size, spec.img_size))
    with torch.no_grad():
        feats = torch.cat([patch_features(model, b) for b in x.split(batch)]).half()
    head = DenseHead(model.embed_dim, 11)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3)

    def backbone_pass() -> None:
        with torch.no_grad():
            for b in x.split(batch):
                patch_features(model, b)

    def cached_epoch() -> None:
        for idx in torch.randperm(images).split(16):
            loss = F.cross_entropy(head(feats[idx].float(), labels.shape[-2:]), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    times = interleaved({"backbone": backbone_pass, "cached": cached_epoch}, repeats=repeats, warmup=1)
    med, lo, hi = ratio_stats(times["cached"], times["backbone"])
    t0 = time.perf_counter()
    with torch.no_grad():
        for b in x.split(batch):
            global_features(model, b, 4)
    linear_ips = images / (time.perf_counter() - t0)
    dense_ips = images / min(times["backbone"])
    rows = [["cached dense-probe epoch / backbone pass", f"{med:.3f}", f"{lo:.3f}-{hi:.3f}", "<= 0.1"],
            ["feature extraction, dense (img/s)", f"{dense_ips:.0f}", "", ""],
            ["feature extraction, linear: [CLS] x 4 blocks + avgpool (img/s)", f"{linear_ips:.0f}", "", ""]]
    return (f"evaluation on {size}, {images} images of {spec.img_size} px, batch {batch}, {repeats} interleaved "
            f"rounds\n\n" + table(rows, ["measure", "value", "IQR", "target"]))
