"""The configs of the post-hoc commands on a trained backbone, `quant.*`, `trainfree.*` and `export.*` (re-exported
by `vitsinks.configs.schema`)."""

from __future__ import annotations

from dataclasses import dataclass

from vitsinks.utils.bounded import bounded


@dataclass
class QuantConfig:
    """Simulated quantization (`vitsinks.quantize`, docs/quantization.md): symmetric integer, per tensor, of the
    weights of every linear layer of the blocks and of their inputs (static ranges calibrated on the first
    `calib_images` TRAIN images of the `selection` order; the measurements use the first `n_images` validation
    images)."""

    weight_bits: int = bounded(8, ge=2, le=16)
    act_bits: int = bounded(8, ge=2, le=16)
    calib_images: int = bounded(32, ge=1)
    n_images: int = bounded(64, ge=1)
    probes: bool = True  # re-run the run's linear / dense probes on the quantized backbone (their change)


@dataclass
class TrainFreeConfig:
    """A training-free mitigation applied to a trained backbone (`vitsinks.trainfree`, docs/trainfree.md).

    `method`: test_time_register | mean_massive | zero_massive (None: none). The edit is fitted on the first
    `fit_images` images of the `selection` order of the checkpoint's data.
    """

    method: str | None = None
    fit_images: int = bounded(64, ge=1)
    neurons: int = bounded(10, ge=1)  # test_time_register: how many of the top-ranked register neurons are moved
    outlier_k: float = bounded(5.0, gt=1)  # test_time_register: outliers are patches above k x the median norm
    massive: int = bounded(2, ge=1)  # mean_massive / zero_massive: how many of the largest activation channels
    probes: bool = True  # after the diagnostics, the linear and dense probes of the edited model (as after training)
    overwrite: bool = False  # replace its derived run (else: refused; an unfinished one of the same edit is redone)
    source: str | None = None  # set by vitsinks.trainfree: the checkpoint the edit was fitted on


@dataclass
class ExportConfig:
    """Where the folder goes and whether it is published (`vitsinks.publish`, docs/export.md)."""

    out: str | None = None  # the folder to write: new or empty, or an earlier export of the same checkpoint
    push: bool = False  # upload the folder to the Hugging Face hub (export.repo; the endpoint: HF_ENDPOINT)
    repo: str | None = None  # the hub repository, <user or organisation>/<name> (created if it does not exist)
    private: bool = False  # create the hub repository private (an existing one keeps its visibility)
    license: str | None = None  # the card's license (None: the package's own, else `other`)
