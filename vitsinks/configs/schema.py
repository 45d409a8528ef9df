"""Typed configuration: the dataclasses behind the Hydra configs of this folder. Hydra merges the YAML files into
them in struct mode, so a misspelt key or a value of the wrong type fails at composition, naming it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from vitsinks.configs.checks import check_config
from vitsinks.configs.posthoc_schema import ExportConfig, QuantConfig, TrainFreeConfig  # noqa: F401
from vitsinks.configs.search import user_folders
from vitsinks.configs.user_inputs import quote_unicode, renamed_groups, renamed_user_groups, yaml_named

# The model's config and closed sets live with the model (their registries build them); re-exported here.
from vitsinks.models.config import Attn, ModelConfig, PatchEmbed, PosEmbed  # noqa: F401
from vitsinks.models.mitigations.gate import Gate  # noqa: F401
from vitsinks.models.mitigations.global_pathway import GlobalPathwayConfig, RecipientGate  # noqa: F401
from vitsinks.utils.bounded import bounded

# Closed sets: a value outside them stops at composition with the allowed values (member names are the values). The
# open sets (data sets, objectives, probe protocols) are `str` fields checked against their registries (`check_config`).
OnBadImage = StrEnum("OnBadImage", "skip error", module=__name__)
Precision = StrEnum("Precision", "auto bf16 fp32", module=__name__)
WandbMode = StrEnum("WandbMode", "auto online offline disabled", module=__name__)
SinkRule = StrEnum("SinkRule", "relaxed def1", module=__name__)
SinkRatio = StrEnum("SinkRatio", "ratio_out ratio_head", module=__name__)
DenseBackend = StrEnum("DenseBackend", "native mmseg", module=__name__)
ClusterName = StrEnum("ClusterName", "local slurm", module=__name__)
Device = StrEnum("Device", "auto cpu cuda", module=__name__)
SigregForm = StrEnum("SigregForm", "per_view_global pooled_per_rank", module=__name__)
BatchNormStats = StrEnum("BatchNormStats", "global_batch per_rank", module=__name__)
ImageOrder = StrEnum("ImageOrder", "permuted first", module=__name__)
Interpolation = StrEnum("Interpolation", "bicubic bilinear", module=__name__)
Block0Policy = StrEnum("Block0Policy", "one_block_counts always_apart", module=__name__)
ViewsBackend = StrEnum("ViewsBackend", "cpu device", module=__name__)
ViewsStyle = StrEnum("ViewsStyle", "dino kempner", module=__name__)


@dataclass
class DataConfig:
    """Dataset choice. `root` is needed by the on-disk datasets; `synthetic` is generated on the fly."""

    name: str = "synthetic"
    root: str | None = None
    num_classes: int = bounded(10, ge=0)
    image_size: int = bounded(64, ge=1)  # resolution the synthetic images are drawn at
    train_size: int = bounded(4096, ge=1)  # synthetic: images per epoch
    val_size: int = bounded(1024, ge=1)  # synthetic: validation images
    num_workers: int | None = bounded(0, ge=0)  # None: min(8, the CPUs this process may use)
    prefetch_factor: int = bounded(2, ge=1)  # batches each training loader worker prepares ahead
    file_list_cache: str | None = None  # ImageFolder: folder of the cached file lists (None: scan at every start)
    on_bad_image: OnBadImage = OnBadImage.skip  # skip (warn and count) | error
    voc_aug: bool = False  # voc: train on SegmentationClassAug (ImageSets/Segmentation/train_aug.txt)
    patch_size: int = bounded(4, ge=1)  # sink tasks: the patch grid the task is defined on (set to the model's)
    marked_frac: float = bounded(0.03, gt=0, lt=1)  # sinktask_nop: share of patches that receive the update
    marker: float = bounded(3.0, gt=0)  # sink tasks: strength of the marker that flags a marked / source patch


@dataclass
class ViewsConfig:
    """Multi-crop views (`style`: lightly's DINO views or the reference's): `n_global` large crops, `n_local` small."""

    n_global: int = bounded(2, ge=1)
    global_size: int = bounded(64, ge=1)
    global_scale: list[float] = bounded(factory=lambda: [0.3, 1.0], gt=0, le=1)  # share of the image's area
    n_local: int = bounded(2, ge=0)
    local_size: int = bounded(32, ge=1)
    local_scale: list[float] = bounded(factory=lambda: [0.05, 0.3], gt=0, le=1)
    color_jitter: float = bounded(0.8, ge=0, le=1)  # probabilities
    grayscale: float = bounded(0.2, ge=0, le=1)
    blur: float = bounded(0.5, ge=0, le=1)
    solarize: float = bounded(0.1, ge=0, le=1)
    hflip: float = bounded(0.5, ge=0, le=1)
    # cpu: the style's transforms on PIL images in the loader workers; device (style=dino only): the workers crop and
    # flip (uint8), the photometric ops run batched on the training device (docs/data.md); same distributions, other
    # random draws
    backend: ViewsBackend = ViewsBackend.cpu
    # dino: lightly's DINO views (DINO's per-view asymmetry); kempner: the reference's src/data.py views (torchvision,
    # the same pipeline for every view: ColorJitter(0.8, 0.8, 0.8, 0.2), 7-px blur, bilinear crops; `solarize` is its
    # RandomApply's p around RandomSolarize(p=0.5), so half of it in effect). backend=cpu only
    style: ViewsStyle = ViewsStyle.dino


@dataclass
class ObjectiveConfig:
    """`lejepa`: lambda * SIGReg + (1 - lambda) * invariance, on a `LeJEPAProjectionHead`.

    `supervised`: the dataset's own targets: per-patch regression on the residual stream for the sink tasks
    (`data=sinktask_*`), image-level classification (linear head on the final-norm [CLS]) for labelled data.
    """

    name: str = "lejepa"
    lamb: float = bounded(0.05, ge=0, le=1)
    slices: int = bounded(1024, ge=1)  # SIGReg's random directions
    knots: int = bounded(17, ge=2)  # SIGReg's integration points
    proj_hidden: int = bounded(512, ge=1)
    proj_out: int = bounded(64, ge=1)
    proj_layers: int = bounded(3, ge=2)
    projector_bn: BatchNormStats = BatchNormStats.global_batch  # the projector's BatchNorm statistics under DDP
    sigreg: SigregForm = SigregForm.per_view_global  # pooled_per_rank: the reference's (one statistic of V x N per GPU)
    # lejepa: the loss computed inside the run's bf16 autocast on the bf16 projections (slices drawn in bf16: the
    # reference's); false: in fp32 outside autocast. Needs sigreg=pooled_per_rank
    loss_in_autocast: bool = False
    probe_lr: float = bounded(1e-3, ge=0)
    probe_weight_decay: float = bounded(0.0, ge=0)  # the online probe's (the reference's: 1e-7)
    cm_penalty: float = bounded(0.0, ge=0)  # lambda_B of the common-mode penalty on every block's attention update
    cm_skip_blocks: int = bounded(0, ge=0)  # the first blocks the penalty leaves out
    cm_pre_gate: bool = False  # penalise the attention update before the attention gate


@dataclass
class TrainConfig:
    """Optimisation. `batch_size` is the global batch (split over ranks); `lr` is for that global batch."""

    epochs: int = bounded(3, ge=1)
    max_steps: int | None = bounded(None, ge=1)  # stop early after this many steps (None: run all epochs)
    batch_size: int = bounded(64, ge=1)
    lr: float = bounded(5e-4, gt=0)
    weight_decay: float = bounded(0.05, ge=0)
    decay_all_params: bool = False  # weight decay on every parameter (the reference's); false: on matrices only
    warmup_epochs: float = bounded(0.5, ge=0)
    warmup_from_zero: bool = False  # warmup lr step / warmup, the first step at 0 (the reference's); false: step + 1
    min_lr_ratio: float = bounded(1e-3, ge=0, le=1)  # cosine decays to lr * min_lr_ratio
    grad_clip: float = bounded(1.0, ge=0)
    precision: Precision = Precision.auto  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    compile: bool = False  # torch.compile every block (before DDP); for CUDA (on CPU it works, slow to compile)
    grad_checkpointing: bool = False  # recompute the blocks' activations in backward (timm's set_grad_checkpointing)
    # CPU training: torch's intra-op threads (None: the CPUs this process may use minus the loader workers, at
    # least 1, so that the compute threads and the workers never share a core). Results are bit-identical only
    # with the same thread count (docs/training.md#what-reproduces).
    cpu_threads: int | None = bounded(None, ge=1)
    ddp_static_graph: bool = True  # DDP static_graph: each step uses the same parameters (docs/training-step.md)
    # steps between logged metrics; the NaN / stop flags are also checked then (a host sync): a stop request
    # (preemption) takes effect within log_every steps, a non-finite loss is reported by its first step
    log_every: int = bounded(10, ge=1)
    ckpt_every: int = bounded(100, ge=1)  # steps between periodic checkpoints (last.pt: also at every epoch end)
    keep_periodic: bool = True
    # the kept step_*.pt hold the model's weights only (backbone, projector, probe; no optimizer or RNG state):
    # about a third of a full checkpoint; the diagnostics, probes and derived runs read them, resuming does not
    periodic_weights_only: bool = False


@dataclass
class MonitorsConfig:
    """The SSL monitors logged with every validation (docs/training.md#the-ssl-monitors): the online k-NN top-1 of the
    validation images against a bank of training images, and RankMe of the validation embeddings (runs on labelled
    images: objective=lejepa, and objective=supervised on classification data)."""

    knn_k: int = bounded(20, ge=1)  # neighbours that vote (DINO's 20; at most the bank's size)
    knn_temperature: float = bounded(0.07, gt=0)  # each neighbour votes exp(cosine / T) (DINO's 0.07)
    # training images in the k-NN bank: the first ones of the split in the seeded `selection` order, decoded once and
    # embedded again at every validation (the first run: about 1 s each on one CPU thread); raise it with the classes
    # (ImageNet: tens of thousands, kept decoded in memory: 0.6 MB an image at 224 px); 0: no k-NN
    knn_bank: int = bounded(512, ge=0)
    rankme: bool = True  # RankMe (Garrido et al. 2023) of the validation embeddings


@dataclass
class WandbConfig:
    """wandb tracking. `auto`: online when an API key is configured, offline otherwise."""

    mode: WandbMode = WandbMode.auto
    project: str = "vitsinks"
    entity: str | None = None


@dataclass
class SelectionConfig:
    """Which images of a split an analysis reads and how they are preprocessed (`vitsinks.data.selection`).

    The presets (`selection=kempner_sinktable`, `selection=kempner_causal`) also set the analysis settings of the
    reference's protocols. `name` is written into every output as `protocol`, so that a table says which made it.
    """

    name: str = "vitsinks"
    order: ImageOrder = ImageOrder.permuted  # permuted: a seeded permutation of the split | first: its own order
    seed: int = bounded(0, ge=0)  # the permutation's generator seed
    image_list: str | None = None  # a text file of image file names (or a list shipped in vitsinks/data/lists/)
    crop_pct: float = bounded(0.875, gt=0, le=1)  # shorter side to size / crop_pct (256 for 224 px), then a centre crop
    interpolation: Interpolation = Interpolation.bicubic


@dataclass
class DiagnosticsConfig:
    """Sink diagnostics: run on a fixed image set at every checkpoint save (and by `vitsinks.diagnose`)."""

    enabled: bool = True
    n_images: int = bounded(16, ge=1)  # validation images, in the order of `selection`
    plots: bool = True
    rule: SinkRule = SinkRule.relaxed  # relaxed (routed_frac >= 0.9) | def1 (min_a >= 1 - eps)
    eps: float = bounded(0.5, gt=0, le=0.5)  # def1; above 0.5 a head can have several sinks
    ratio: SinkRatio = SinkRatio.ratio_out
    use_stable_rank: bool = True  # broadcast-like also needs stable rank <= 1.5
    block0: bool = False  # the reference-layout sink table (sink_table.md) also counts block 0
    # Block 0 is counted and reported apart from blocks 1..L-1 (sinks per image, head selection, by_class scopes).
    # one_block_counts: except in a one-block model, whose only block is the main scope | always_apart: the
    # reference's rule (sink_table.py, select_heads.py): a one-block model's main scope is empty (0 sinks per image)
    block0_policy: Block0Policy = Block0Policy.one_block_counts
    # The residual side (docs/residual.md): token norms, high-norm tokens, massive activations, register neurons.
    residual: bool = True
    high_norm_k: list[float] = bounded(factory=lambda: [2.0, 5.0, 10.0, 20.0], gt=1)  # x the block's median norm
    register_neurons: int = bounded(10, ge=1)  # the top-ranked MLP units reported per block
    report: bool = True  # the visual report page (report.html) beside the summary
    report_images: int = bounded(4, ge=1)  # the fixed images the report page shows


@dataclass
class InterveneConfig:
    """Causal interventions (`vitsinks.intervene`, docs/fidelity.md): one head edited at a time, attention held fixed.

    Head selection when `heads` is empty (`min_events`, `top_k`, ...): docs/interventions.md.
    """

    n_images: int = bounded(256, ge=2)  # validation images edited, the first n of the `selection` order
    heldout_images: int = bounded(64, ge=0)  # the next ones in that order: the source of mean_sink_value (disjoint)
    batch_size: int = bounded(32, ge=2)  # the donor of an image is another image of its batch
    heads: list[str] = field(default_factory=list)  # ["block:head", ...]; empty: automatic selection
    edits: list[str] = field(default_factory=list)  # empty: every edit that applies to the model
    min_events: int = bounded(50, ge=1)
    top_k: int = bounded(16, ge=0)
    top_k_block0: int = bounded(4, ge=0)
    min_class_events: int = bounded(20, ge=1)
    # the reference's own formulas (selection=kempner_causal): its redirect (A's sink column zeroed, rows divided by
    # their sum clamped at 1e-12) as the extra edit redirect_sink_attention_ref, and the donor cosine's direction
    # averaged over all patches (default: the exact redirect from the scores; the sink patch left out)
    reference_formulas: bool = False
    # random non-sink patches: one generator per shard, seeded seed + 1000 * shard; the noise / shuffle controls: a
    # second one seeded seed + 1000 * shard + 500
    seed: int = bounded(0, ge=0)
    shard: int = bounded(0, ge=0)  # this process edits heads[shard::nshards]
    nshards: int = bounded(1, ge=1)
    merge: str | None = None  # a folder of shards to join into the final outputs
    out: str | None = None  # default: <run>/interventions/<checkpoint> (loose file: <runs_dir>/interventions/<model>)


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
    nodes: int = bounded(1, ge=1)
    gpus_per_node: int = bounded(0, ge=0)
    tasks_per_node: int = bounded(1, ge=1)  # CPU jobs only; with GPUs there is one task per GPU
    cpus_per_task: int = bounded(8, ge=1)
    mem_gb: int | None = bounded(None, ge=1)
    time_min: int = bounded(240, ge=1)
    constraint: str | None = None
    signal_delay_s: int = bounded(120, ge=0)  # the preemption/time-limit signal comes this long before the end
    max_requeues: int = bounded(3, ge=0)  # requeues after a time-out (preemptions are always requeued)
    array_parallelism: int = bounded(64, ge=1)  # at most this many array tasks run at once
    additional: dict[str, Any] = field(default_factory=dict)  # extra sbatch parameters, e.g. {mail-type: END}
    setup: list[str] = field(default_factory=list)  # shell lines run before the job, e.g. module load ...
    logs_dir: str | None = None  # submitit's folder (default: <runs_dir>/slurm_logs)


@dataclass
class EvalConfig:
    """Frozen-backbone evaluations (`vitsinks.eval.linear`, `vitsinks.eval.dense`) and what runs after training.

    `after_train` (on by default): diagnostics, linear probe (with the k-NN probe, `knn`) and dense probe of the
    final checkpoint, in the training job, so that every finished run has the numbers a leaderboard compares; data
    without class labels (the sink tasks) has no probes.
    """

    after_train: bool = True
    batch_size: int = bounded(64, ge=1)  # feature extraction
    max_train_images: int | None = bounded(None, ge=1)  # subsample for quick checks (None: the whole split)
    max_val_images: int | None = bounded(None, ge=1)
    linear_lrs: list[float] = bounded(factory=lambda: [1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3], gt=0)
    linear_last_blocks: list[int] = bounded(factory=lambda: [1, 4], ge=1)
    linear_epochs: int = bounded(10, ge=1)
    linear_batch_size: int = bounded(256, ge=1)
    linear_protocol: str = "dinov2"  # what each head reads and its optimiser (vitsinks/probes/linear_protocols.py)
    knn: bool = True  # eval.linear also runs the k-NN probe on the features it cached (no training: seconds)
    knn_protocol: str = "dino"  # the k-NN probe's feature, ks and temperature (vitsinks/probes/knn_protocols.py)
    dense_data: str | None = None  # after_train: (default: the training data when it has masks)
    dense_root: str | None = None
    # The dense probe's protocol (vitsinks/probes/dense_protocols.py, eval/README.md): dinov2 (BatchNorm + 1x1 conv,
    # sliding window at full label resolution) | kempner (the reference's Linear probe at 512 px, augmented, best
    # val epoch) | kempner_cached (the same on cached features, 3 probe seeds). The fields below left at None take
    # the protocol's own value; the kempner protocols accept only dense_size and dense_epochs as overrides.
    dense_protocol: str = "dinov2"
    dense_size: int | None = bounded(None, ge=1)  # input side in pixels (dinov2: the model's; kempner: 512)
    dense_epochs: int | None = bounded(None, ge=1)  # dinov2 10; kempner ADE20K 10 / VOC 25; kempner_cached 25 / 100
    dense_lr: float | None = bounded(None, gt=0)  # dinov2 only (1e-3)
    dense_weight_decay: float | None = bounded(None, ge=0)  # dinov2 only (1e-4)
    dense_batch_size: int | None = bounded(None, ge=1)  # dinov2 only (16)
    dense_augment: bool | None = None  # dinov2 only (false: cached features; true: random resized crop + flip)
    dense_examples: int = bounded(4, ge=0)  # val images drawn as image | ground truth | prediction
    # Who trains and scores the dense probe: native (vitsinks' own, every protocol) | mmseg (mmsegmentation's
    # datasets, segmentor, Runner and IoUMetric, for the dinov2 protocol on ade20k or voc; `vitsinks[mmseg]`)
    dense_backend: DenseBackend = DenseBackend.native
    dense_mmseg_config: str = "linear"  # mmseg backend: mmseg/<name>_<data>.py in the config folders


@dataclass
class Config:
    """The whole run."""

    exp: str = "base"  # set at composition to the name of the exp file chosen (`exp=<name>`); in the run name
    name: str = MISSING
    seed: int = bounded(0, ge=0)
    runs_dir: str = "runs"
    ckpt: str | None = None  # the model of a command that reads one (vitsinks.run.source): a checkpoint file
    run: str | None = None  # the model: a run folder, its checkpoints/last.pt (diagnose: all of a trained run's)
    # the model: another library's, read unmodified (vitsinks.pretrained): timm:NAME[@FILE] | hf:ID or folder |
    # open_clip:NAME@TAG or FILE | vitsinks:EXPORT FOLDER
    hub: str | None = None
    imported: str | None = None  # set by vitsinks: the pretrained model this run holds, imported without training
    # modules imported before the config is checked: your own data sets, objectives, probe protocols or model
    # families, registered where they are defined (docs/extending.md); each command that reads them needs them
    plugins: list[str] = field(default_factory=list)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    views: ViewsConfig = field(default_factory=ViewsConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    monitors: MonitorsConfig = field(default_factory=MonitorsConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)  # saved as `protocol` (configs.upgrade)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    intervene: InterveneConfig = field(default_factory=InterveneConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    trainfree: TrainFreeConfig = field(default_factory=TrainFreeConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


class UserConfigs(SearchPathPlugin):
    """Hydra's search path with the user's config folders (`search.user_folders`) before the package's, so that
    their files win; only where the package's configs are the primary ones."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        main = SearchPathQuery(provider="main", path=str(config_dir()))
        if not any(e.provider == main.provider and e.path == main.path for e in search_path.get_path()):
            return
        for folder in user_folders(strict=False):  # compose_config has stopped on a missing $VITSINKS_CONFIGS
            search_path.prepend(provider="vitsinks user configs", path=f"file://{folder}", anchor=main)


def register_configs() -> None:
    """Register the schema with Hydra (the `schema` entry of `config.yaml`) and the user's config folders."""
    ConfigStore.instance().store(name="schema", node=Config)
    Plugins.instance().register(UserConfigs)
    renamed_user_groups()


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


def compose_config(overrides: list[str] | None = None, hydra: bool = False) -> DictConfig:
    """The config of these overrides as Hydra composes it from the user's config folders over the package's (not
    checked; `hydra=True` keeps the `hydra` node: the command line's overrides and the logging set-up), its `exp`
    the name of the exp file chosen (so that a file needs no `exp:` key of its own)."""
    user_folders()
    register_configs()
    overrides = renamed_groups(overrides or [])
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"), yaml_named():  # broken YAML: a line
        cfg = compose(config_name="config", overrides=quote_unicode(overrides), return_hydra_config=True)
    choice = cfg.hydra.runtime.choices.get("exp")
    with open_dict(cfg):
        if choice is not None:
            cfg.exp = choice
        if not hydra:
            del cfg["hydra"]
    return cfg


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """The config of these overrides, composed and checked (`check_config`) as the command line does."""
    cfg = compose_config(overrides)
    check_config(cfg)
    return cfg
