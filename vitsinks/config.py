"""Typed configuration: dataclasses that back the Hydra configs in `configs/`.

The dataclasses are the schema: Hydra merges the YAML files into them in struct mode, so a misspelt key or a
value of the wrong type fails at composition with a message that names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


@dataclass
class GlobalPathwayConfig:
    """The SPEC section 7 global pathway beside attention in every block (`vitsinks.models.pathway`)."""

    enabled: bool = False
    state_dim: int = 64  # d_g
    gate: str = "learned"  # recipient gate: learned (sigmoid(w . z_i + b)) | hier (times a per-image gate from g)
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
    patch_embed: str = "learned"  # learned | orthonormal (frozen isometry, no bias: targets on the residual stream)
    pos_embed: str = "learn"  # learn | none
    layerscale_init: float | None = None
    drop_path: float = 0.0
    gate: str = "none"
    registers: int = 0
    attn: str = "softmax"
    global_pathway: GlobalPathwayConfig = field(default_factory=GlobalPathwayConfig)
    pretrained: str | None = None  # timm model name (downloads) or a state-dict / checkpoint path


@dataclass
class DataConfig:
    """Dataset choice. `root` is needed by the on-disk datasets; `synthetic` is generated on the fly."""

    name: str = "synthetic"
    root: str | None = None
    num_classes: int = 10
    image_size: int = 64  # resolution the synthetic images are drawn at
    train_size: int = 4096  # synthetic: images per epoch
    val_size: int = 1024  # synthetic: validation images
    num_workers: int = 0
    on_bad_image: str = "skip"  # skip (warn and count) | error
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

    name: str = "lejepa"  # lejepa | supervised
    lamb: float = 0.05
    slices: int = 1024
    knots: int = 17
    proj_hidden: int = 512
    proj_out: int = 64
    proj_layers: int = 3
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
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    compile: bool = False
    log_every: int = 10
    ckpt_every: int = 100  # steps between periodic checkpoints (last.pt is also written at every epoch end)
    keep_periodic: bool = True


@dataclass
class WandbConfig:
    """wandb tracking. `auto`: online when an API key is configured, offline otherwise."""

    mode: str = "auto"  # auto | online | offline | disabled
    project: str = "vitsinks"
    entity: str | None = None


@dataclass
class DiagnosticsConfig:
    """Sink diagnostics: run on a fixed image set at every checkpoint save (and by `vitsinks.diagnose`)."""

    enabled: bool = True
    n_images: int = 16  # the first n validation images
    plots: bool = True
    rule: str = "relaxed"  # relaxed (routed_frac >= 0.9) | def1 (min_a >= 1 - eps)
    eps: float = 0.5
    ratio: str = "ratio_out"  # ratio_out | ratio_head
    use_stable_rank: bool = True  # broadcast-like also needs stable rank <= 1.5


@dataclass
class InterveneConfig:
    """Causal interventions (`vitsinks.intervene`, SPEC section 6): one head edited at a time, attention held fixed.

    Head selection (when `heads` is empty) per class (NOP / broadcast): heads with >= `min_events` events of that
    class among the images, the `top_k` of blocks >= 1 and the `top_k_block0` of block 0 by event count; a head
    enters a class's means if it has >= `min_class_events` events of that class. Events and classes follow the
    `diagnostics` settings (rule, eps, ratio, use_stable_rank).
    """

    n_images: int = 256  # the first n validation images are edited
    heldout_images: int = 64  # the next ones: the source of mean_sink_value (disjoint from the edited images)
    batch_size: int = 32
    heads: list[str] = field(default_factory=list)  # ["block:head", ...]; empty: automatic selection
    edits: list[str] = field(default_factory=list)  # empty: every edit that applies to the model
    min_events: int = 50
    top_k: int = 16
    top_k_block0: int = 4
    min_class_events: int = 20
    seed: int = 0  # the random non-sink patches of donor_nonsink_value / zero_random_nonsink_value
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

    name: str = "local"  # local | slurm
    device: str = "auto"  # auto | cpu | cuda
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
    dense_data: str | None = None  # after_train: ade20k | voc (default: the training data when it has masks)
    dense_root: str | None = None
    dense_epochs: int = 10
    dense_lr: float = 1e-3
    dense_weight_decay: float = 1e-4
    dense_batch_size: int = 16
    dense_augment: bool = False  # random resized crop + flip with features recomputed; False: cached features
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
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    intervene: InterveneConfig = field(default_factory=InterveneConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (the `schema` entry of `configs/config.yaml`), and every
    cluster profile of `slurm/cluster/*.yaml` as an option of the `cluster` group (`cluster=<profile>`)."""
    cs = ConfigStore.instance()
    cs.store(name="schema", node=Config)
    for path in sorted((Path(__file__).resolve().parent.parent / "slurm" / "cluster").glob("*.yaml")):
        cs.store(group="cluster", name=path.stem, node=OmegaConf.load(path))


def config_dir() -> Path:
    """The `configs/` folder shipped with the repository."""
    path = Path(__file__).resolve().parent.parent / "configs"
    if not (path / "config.yaml").is_file():
        raise FileNotFoundError(
            f"no Hydra configs at {path}: install vitsinks from its repository checkout (pip install -e .)"
        )
    return path


def exp_names() -> list[str]:
    """Every variant that has a config (`configs/exp/*.yaml`), sorted by name."""
    return sorted(p.stem for p in (config_dir() / "exp").glob("*.yaml"))


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """Resolved plain-dict copy of a config."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose the config from Python, exactly as the command line would (used by tests and notebooks)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides or []))
