"""Typed configuration: dataclasses that back the Hydra configs of this folder.

The dataclasses are the schema: Hydra merges the YAML files into them in struct mode, so a misspelt key or a
value of the wrong type fails at composition with a message that names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from vitsinks.utils.errors import ConfigError

# Closed sets: a value outside them stops at composition with the allowed values (member names are the values).
Gate = StrEnum("Gate", "none elementwise headwise", module=__name__)
Attn = StrEnum("Attn", "softmax relu sigmoid sink_logit", module=__name__)
PatchEmbed = StrEnum("PatchEmbed", "learned orthonormal", module=__name__)
PosEmbed = StrEnum("PosEmbed", "learn none", module=__name__)
RecipientGate = StrEnum("RecipientGate", "learned hier", module=__name__)
DataName = StrEnum("DataName", "synthetic fashion_mnist imagenet sinktask_nop sinktask_broadcast ade20k voc",
                   module=__name__)
OnBadImage = StrEnum("OnBadImage", "skip error", module=__name__)
Objective = StrEnum("Objective", "lejepa supervised", module=__name__)
Precision = StrEnum("Precision", "auto bf16 fp32", module=__name__)
WandbMode = StrEnum("WandbMode", "auto online offline disabled", module=__name__)
SinkRule = StrEnum("SinkRule", "relaxed def1", module=__name__)
SinkRatio = StrEnum("SinkRatio", "ratio_out ratio_head", module=__name__)
ClusterName = StrEnum("ClusterName", "local slurm", module=__name__)
Device = StrEnum("Device", "auto cpu cuda", module=__name__)
DenseProtocolName = StrEnum("DenseProtocolName", "dinov2 kempner kempner_cached", module=__name__)
SigregForm = StrEnum("SigregForm", "per_view_global pooled_per_rank", module=__name__)
BatchNormStats = StrEnum("BatchNormStats", "global_batch per_rank", module=__name__)
ImageOrder = StrEnum("ImageOrder", "permuted first", module=__name__)
Interpolation = StrEnum("Interpolation", "bicubic bilinear", module=__name__)


@dataclass
class GlobalPathwayConfig:
    """The docs/fidelity.md global pathway beside attention in every block (`vitsinks.models.pathway`)."""

    enabled: bool = False
    state_dim: int = 64  # d_g
    gate: RecipientGate = RecipientGate.learned  # learned: sigmoid(w . z_i + b); hier: sigmoid(a_i) * softmax(r_i)_bc
    layerscale_init: float | None = None  # ls3; None: no LayerScale on the pathway


@dataclass
class ModelConfig:
    """ViT architecture and sink-mitigation switches (see `vitsinks.models.build_vit`)."""

    size: str = "vit_cpu"
    img_size: int | None = None
    patch_size: int | None = None
    embed_dim: int | None = None
    depth: int | None = None
    num_heads: int | None = None
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    proj_bias: bool = True  # attention output-projection bias
    mlp: bool = True  # False: attention-only blocks (the sink tasks)
    patch_embed: PatchEmbed = PatchEmbed.learned  # orthonormal: frozen isometry, no bias (sink tasks)
    pos_embed: PosEmbed = PosEmbed.learn  # learn | none
    layerscale_init: float | None = None
    drop_path: float = 0.0
    gate: Gate = Gate.none
    registers: int = 0
    register_pos_embed: bool = False  # True: the position embedding covers [CLS], registers and patches (reference)
    prefix_init_std: float | None = None  # [CLS] / register init: None timm's (normal std 1e-6); x: trunc-normal std x
    attn: Attn = Attn.softmax
    global_pathway: GlobalPathwayConfig = field(default_factory=GlobalPathwayConfig)
    pretrained: str | None = None  # timm model name (downloads) or a state-dict / checkpoint path


@dataclass
class DataConfig:
    """Dataset choice. `root` is needed by the on-disk datasets; `synthetic` is generated on the fly."""

    name: DataName = DataName.synthetic
    root: str | None = None
    num_classes: int = 10
    image_size: int = 64  # resolution the synthetic images are drawn at
    train_size: int = 4096  # synthetic: images per epoch
    val_size: int = 1024  # synthetic: validation images
    num_workers: int | None = 0  # None: min(8, the CPUs this process may use)
    on_bad_image: OnBadImage = OnBadImage.skip  # skip (warn and count) | error
    voc_aug: bool = False  # voc: train on SegmentationClassAug (ImageSets/Segmentation/train_aug.txt)
    patch_size: int = 4  # sink tasks: the patch grid the task is defined on (set to the model's)
    marked_frac: float = 0.03  # sinktask_nop: share of patches that receive the update
    marker: float = 3.0  # sink tasks: strength of the marker that flags a marked / source patch


@dataclass
class ViewsConfig:
    """Multi-crop views (lightly transforms): `n_global` large crops and `n_local` small ones."""

    n_global: int = 2
    global_size: int = 64
    global_scale: list[float] = field(default_factory=lambda: [0.3, 1.0])
    n_local: int = 2
    local_size: int = 32
    local_scale: list[float] = field(default_factory=lambda: [0.05, 0.3])
    color_jitter: float = 0.8  # probability
    grayscale: float = 0.2
    blur: float = 0.5
    solarize: float = 0.1
    hflip: float = 0.5


@dataclass
class ObjectiveConfig:
    """`lejepa`: lambda * SIGReg + (1 - lambda) * invariance, on a `LeJEPAProjectionHead`.

    `supervised`: the dataset's own targets: per-patch regression on the residual stream for the sink tasks
    (`data=sinktask_*`), image-level classification (linear head on the final-norm [CLS]) for labelled data.
    """

    name: Objective = Objective.lejepa
    lamb: float = 0.05
    slices: int = 1024
    knots: int = 17
    proj_hidden: int = 512
    proj_out: int = 64
    proj_layers: int = 3
    projector_bn: BatchNormStats = BatchNormStats.global_batch  # the projector's BatchNorm statistics under DDP
    sigreg: SigregForm = SigregForm.per_view_global  # pooled_per_rank: the reference's (one statistic of V x N per GPU)
    probe_lr: float = 1e-3
    cm_penalty: float = 0.0  # lambda_B of the common-mode penalty on every block's attention update (0: off)
    cm_skip_blocks: int = 0  # the first blocks the penalty leaves out
    cm_pre_gate: bool = False  # penalise the attention update before the attention gate


@dataclass
class TrainConfig:
    """Optimisation. `batch_size` is the global batch (split over ranks); `lr` is for that global batch."""

    epochs: int = 3
    max_steps: int | None = None  # stop early after this many steps (None: run all epochs)
    batch_size: int = 64
    lr: float = 5e-4
    weight_decay: float = 0.05
    warmup_epochs: float = 0.5
    min_lr_ratio: float = 1e-3  # cosine decays to lr * min_lr_ratio
    grad_clip: float = 1.0
    precision: Precision = Precision.auto  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    compile: bool = False
    log_every: int = 10
    ckpt_every: int = 100  # steps between periodic checkpoints (last.pt is also written at every epoch end)
    keep_periodic: bool = True


@dataclass
class WandbConfig:
    """wandb tracking. `auto`: online when an API key is configured, offline otherwise."""

    mode: WandbMode = WandbMode.auto
    project: str = "vitsinks"
    entity: str | None = None


@dataclass
class ProtocolConfig:
    """Which images of a split an analysis reads and how they are preprocessed (`vitsinks.data.selection`).

    The named presets (`protocol=kempner_sinktable`, `protocol=kempner_causal`) set these and the analysis
    settings of the reference's protocols; `name` is written into every output so that a table says which
    protocol produced it.
    """

    name: str = "vitsinks"
    order: ImageOrder = ImageOrder.permuted  # permuted: a seeded permutation of the split | first: its own order
    seed: int = 0  # the permutation's generator seed
    image_list: str | None = None  # a text file of image file names (or a list shipped in vitsinks/data/lists/)
    crop_pct: float = 0.875  # shorter side resized to size / crop_pct (256 for 224 px), then a centre crop
    interpolation: Interpolation = Interpolation.bicubic


@dataclass
class DiagnosticsConfig:
    """Sink diagnostics: run on a fixed image set at every checkpoint save (and by `vitsinks.diagnose`)."""

    enabled: bool = True
    n_images: int = 16  # validation images, in the order of `protocol`
    plots: bool = True
    rule: SinkRule = SinkRule.relaxed  # relaxed (routed_frac >= 0.9) | def1 (min_a >= 1 - eps)
    eps: float = 0.5
    ratio: SinkRatio = SinkRatio.ratio_out
    use_stable_rank: bool = True  # broadcast-like also needs stable rank <= 1.5
    block0: bool = False  # the reference-layout sink table (sink_table.md) also counts block 0


@dataclass
class InterveneConfig:
    """Causal interventions (`vitsinks.intervene`, docs/fidelity.md): one head edited at a time, attention held fixed.

    Head selection (when `heads` is empty) per class (NOP / broadcast): heads with >= `min_events` events of that
    class among the images, the `top_k` of blocks >= 1 and the `top_k_block0` of block 0 by event count; a head
    enters a class's means if it has >= `min_class_events` events of that class. Events and classes follow the
    `diagnostics` settings (rule, eps, ratio, use_stable_rank).
    """

    n_images: int = 256  # validation images edited, the first n of the `protocol` order
    heldout_images: int = 64  # the next ones in that order: the source of mean_sink_value (disjoint)
    batch_size: int = 32
    heads: list[str] = field(default_factory=list)  # ["block:head", ...]; empty: automatic selection
    edits: list[str] = field(default_factory=list)  # empty: every edit that applies to the model
    min_events: int = 50
    top_k: int = 16
    top_k_block0: int = 4
    min_class_events: int = 20
    seed: int = 0  # random non-sink patches: one generator per shard, seeded seed + 1000 * shard
    shard: int = 0  # this process edits heads[shard::nshards]
    nshards: int = 1
    merge: str | None = None  # a folder of shards to join into the final outputs
    out: str | None = None  # default: <run>/interventions/<checkpoint> (or <runs_dir>/interventions/<model>)


@dataclass
class ClusterConfig:
    """Where the job runs: `local` (this machine, this process) or `slurm` (submitit; see slurm/README.md).

    On SLURM a job has `nodes` x `gpus_per_node` tasks, one process per GPU (`tasks_per_node` CPU processes when
    `gpus_per_node` is 0); `train.batch_size` stays the global batch and `train.lr` its learning rate.
    """

    name: ClusterName = ClusterName.local
    device: Device = Device.auto
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int = 1  # CPU jobs only; with GPUs there is one task per GPU
    cpus_per_task: int = 8
    mem_gb: int | None = None
    time_min: int = 240
    constraint: str | None = None
    signal_delay_s: int = 120  # the preemption/time-limit signal comes this long before the end
    max_requeues: int = 3  # requeues after a time-out (preemptions are always requeued)
    array_parallelism: int = 64  # at most this many array tasks run at once
    additional: dict[str, Any] = field(default_factory=dict)  # extra sbatch parameters, e.g. {mail-type: END}
    setup: list[str] = field(default_factory=list)  # shell lines run before the job, e.g. module load ...
    logs_dir: str | None = None  # submitit's folder (default: <runs_dir>/slurm_logs)


@dataclass
class EvalConfig:
    """Frozen-backbone evaluations (`vitsinks.eval.linear`, `vitsinks.eval.dense`) and what runs after training.

    `after_train`: diagnostics, linear probe and dense probe of the final checkpoint, in the training job.
    """

    after_train: bool = False
    batch_size: int = 64  # feature extraction
    max_train_images: int | None = None  # subsample for quick checks (None: the whole split)
    max_val_images: int | None = None
    linear_lrs: list[float] = field(default_factory=lambda: [1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3])
    linear_last_blocks: list[int] = field(default_factory=lambda: [1, 4])
    linear_epochs: int = 10
    linear_batch_size: int = 256
    dense_data: DataName | None = None  # after_train: (default: the training data when it has masks)
    dense_root: str | None = None
    # The dense probe's protocol (vitsinks/eval/dense_protocols.py, eval/README.md): dinov2 (BatchNorm + 1x1 conv,
    # sliding window at full label resolution) | kempner (the reference's Linear probe at 512 px, augmented, best
    # val epoch) | kempner_cached (the same on cached features, 3 probe seeds). The fields below left at None take
    # the protocol's own value; the kempner protocols accept only dense_size and dense_epochs as overrides.
    dense_protocol: DenseProtocolName = DenseProtocolName.dinov2
    dense_size: int | None = None  # input side in pixels (dinov2: the model's; kempner: 512)
    dense_epochs: int | None = None  # dinov2 10; kempner ADE20K 10 / VOC 25; kempner_cached 25 / 100
    dense_lr: float | None = None  # dinov2 only (1e-3)
    dense_weight_decay: float | None = None  # dinov2 only (1e-4)
    dense_batch_size: int | None = None  # dinov2 only (16)
    dense_augment: bool | None = None  # dinov2 only (false: cached features; true: random resized crop + flip)
    dense_examples: int = 4  # val images drawn as image | ground truth | prediction


@dataclass
class Config:
    """The whole run."""

    exp: str = "base"
    name: str = MISSING
    seed: int = 0
    runs_dir: str = "runs"
    ckpt: str | None = None  # vitsinks.diagnose / eval: the checkpoint to read
    run: str | None = None  # vitsinks.diagnose: a run directory (all its checkpoints)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    views: ViewsConfig = field(default_factory=ViewsConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    intervene: InterveneConfig = field(default_factory=InterveneConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (the `schema` entry of `config.yaml`)."""
    ConfigStore.instance().store(name="schema", node=Config)


def config_dir() -> Path:
    """The folder of the Hydra configs, shipped inside the package (so any install, from any directory, has them)."""
    return Path(__file__).resolve().parent


def exp_names() -> list[str]:
    """Every variant that has a config (`vitsinks/configs/exp/*.yaml`), sorted by name."""
    return sorted(p.stem for p in (config_dir() / "exp").glob("*.yaml"))


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """Resolved plain-dict copy of a config."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True,  # type: ignore[return-value]
                                  enum_to_str=True)


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose the config from Python, exactly as the command line would (used by tests and notebooks), and
    check its numbers (`check_config`)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides or []))
    check_config(cfg)
    return cfg


# (field, lowest allowed, lower bound inclusive); None values mean "the default" and are not checked.
RANGES: tuple[tuple[str, float, bool], ...] = (
    ("train.epochs", 1, True), ("train.max_steps", 1, True), ("train.batch_size", 1, True), ("train.lr", 0, False),
    ("train.weight_decay", 0, True), ("train.warmup_epochs", 0, True), ("train.min_lr_ratio", 0, True),
    ("train.grad_clip", 0, True), ("train.log_every", 1, True), ("train.ckpt_every", 1, True),
    ("model.img_size", 1, True), ("model.patch_size", 1, True), ("model.embed_dim", 1, True),
    ("model.depth", 1, True), ("model.num_heads", 1, True), ("model.mlp_ratio", 0, False),
    ("model.registers", 0, True), ("model.drop_path", 0, True), ("model.global_pathway.state_dim", 1, True),
    ("data.num_classes", 0, True), ("data.image_size", 1, True), ("data.train_size", 1, True),
    ("data.val_size", 1, True), ("data.num_workers", 0, True), ("data.patch_size", 1, True),
    ("views.n_global", 1, True), ("views.global_size", 1, True), ("views.n_local", 0, True),
    ("views.local_size", 1, True), ("objective.lamb", 0, True), ("objective.cm_penalty", 0, True),
    ("objective.cm_skip_blocks", 0, True), ("objective.slices", 1, True), ("objective.knots", 2, True),
    ("objective.proj_hidden", 1, True), ("objective.proj_out", 1, True), ("objective.proj_layers", 2, True),
    ("objective.probe_lr", 0, True), ("model.prefix_init_std", 0, True),
    ("diagnostics.n_images", 1, True), ("diagnostics.eps", 0, False),
    ("intervene.n_images", 2, True), ("intervene.heldout_images", 0, True), ("intervene.batch_size", 2, True),
    ("intervene.nshards", 1, True), ("intervene.shard", 0, True), ("eval.batch_size", 1, True),
    ("eval.max_train_images", 1, True), ("eval.max_val_images", 1, True), ("eval.linear_epochs", 1, True),
    ("eval.linear_batch_size", 1, True), ("eval.dense_epochs", 1, True), ("eval.dense_batch_size", 1, True),
    ("eval.dense_lr", 0, False), ("eval.dense_size", 1, True), ("eval.dense_weight_decay", 0, True),
    ("cluster.nodes", 1, True), ("cluster.gpus_per_node", 0, True),
    ("cluster.tasks_per_node", 1, True), ("cluster.cpus_per_task", 1, True), ("cluster.time_min", 1, True),
    ("protocol.crop_pct", 0, False),
)
UPPER = {"protocol.crop_pct": 1, "train.min_lr_ratio": 1, "model.drop_path": 0.999, "objective.lamb": 1,
         "diagnostics.eps": 0.5}


def check_config(cfg: DictConfig) -> None:
    """Numbers out of range and sizes that do not fit, checked once after composition: `ConfigError` naming the
    field, its value and what is allowed (the closed sets are enums, checked by OmegaConf itself)."""
    problems = []
    for key, low, inclusive in RANGES:
        value = OmegaConf.select(cfg, key, default=None)
        if value is None:
            continue
        high = UPPER.get(key, math.inf)
        if not math.isfinite(value) or value < low or (value == low and not inclusive) or value > high:
            bound = f"{'>=' if inclusive else '>'} {low}" + (f" and <= {high}" if high < math.inf else "")
            problems.append(f"{key}={value} (must be {bound})")
    for key in ("eval.linear_lrs", "eval.linear_last_blocks"):
        if any(not math.isfinite(v) or v <= 0 for v in OmegaConf.select(cfg, key, default=[]) or []):
            problems.append(f"{key}={list(OmegaConf.select(cfg, key))} (every entry must be > 0)")
    m = cfg.model
    from vitsinks.models.vit import SIZES

    if m.size not in SIZES:
        problems.append(f"model.size={m.size} (choose one of {', '.join(sorted(SIZES))})")
    else:
        spec = SIZES[m.size]
        img, patch = m.img_size or spec.img_size, m.patch_size or spec.patch_size
        dim, heads = m.embed_dim or spec.embed_dim, m.num_heads or spec.num_heads
        if img > 0 and patch > 0 and img % patch:
            problems.append(f"model.img_size={img} is not a multiple of model.patch_size={patch}")
        if dim > 0 and heads > 0 and dim % heads:
            problems.append(f"model.embed_dim={dim} is not divisible by model.num_heads={heads}")
    st = cfg.intervene
    if st.shard is not None and st.nshards is not None and st.shard >= st.nshards:
        problems.append(f"intervene.shard={st.shard} (must be < intervene.nshards={st.nshards})")
    if problems:
        raise ConfigError("invalid setting" + ("s" if len(problems) > 1 else "") + ": " + "; ".join(problems))
