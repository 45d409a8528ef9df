"""The training step's cost options: compiled blocks, activation checkpointing, no host sync per step (the NaN and
stop flags checked later, on every rank alike), the throughput and data-wait metrics, DDP's settings."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.distributed import run_ranks
from tests.helpers.tiny import tiny_cfg, tiny_vit
from vitsinks.configs.schema import ObjectiveConfig
from vitsinks.objectives.penalty import CommonModePenalty
from vitsinks.train import checkpoint as ckpt
from vitsinks.train.trainer import NonFiniteLoss, Trainer
from vitsinks.utils.metrics_log import read_metrics


def losses(run_dir: Path) -> list[float]:
    return [m["loss"] for m in read_metrics(run_dir) if "loss" in m]


# ---- activation checkpointing --------------------------------------------------------------------------------------


def _loss_and_grads(checkpointing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[int]]:
    torch.manual_seed(0)
    model = tiny_vit(drop_path=0.2)  # random masks: the recomputation must draw the same ones
    penalty = CommonModePenalty(model.blocks, ObjectiveConfig(cm_penalty=0.5))  # hooks that record in forward
    model.set_grad_checkpointing(checkpointing)
    model.train()
    torch.manual_seed(1)
    x = torch.randn(4, 3, 32, 32)
    loss = model(x).square().mean() + penalty()[0]
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, [len(t) for t in penalty.terms]


def test_activation_checkpointing_gives_the_same_loss_and_gradients() -> None:
    loss, grads, _ = _loss_and_grads(False)
    loss_ck, grads_ck, recorded_again = _loss_and_grads(True)
    # the recomputation runs the same fp32 kernels on the same inputs with the same random state: bitwise equal
    assert torch.equal(loss, loss_ck)
    assert grads.keys() == grads_ck.keys() and len(grads) > 20
    assert all(torch.equal(grads[k], grads_ck[k]) for k in grads)
    # the blocks really ran twice (the recomputation recorded the penalty's terms again: the trainer resets them)
    assert recorded_again == [1, 1]


@pytest.mark.slow
def test_a_checkpointed_run_trains_exactly_like_the_plain_one(runs: Path) -> None:
    plain = Trainer(tiny_cfg(runs, "name=plain", "train.max_steps=3", "exp=global+pen")).fit()
    tr = Trainer(tiny_cfg(runs, "name=ck", "train.max_steps=3", "exp=global+pen", "train.grad_checkpointing=true"))
    assert tr.model.backbone.grad_checkpointing
    tr.fit()
    assert losses(Path(plain["run_dir"])) == losses(runs / "ck")  # exact: see the test above


# ---- compiled blocks -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_compiled_run_gives_the_eager_losses(runs: Path) -> None:
    torch.set_num_threads(1)
    eager = Trainer(tiny_cfg(runs, "name=eager", "train.max_steps=3", "views.n_local=0")).fit()
    tr = Trainer(tiny_cfg(runs, "name=compiled", "train.max_steps=3", "views.n_local=0", "train.compile=true"))
    assert all(blk._compiled_call_impl is not None for blk in tr.model.backbone.blocks)
    assert tr.model.state_dict().keys() == Trainer(tiny_cfg(runs, "name=x")).model.state_dict().keys()
    tr.fit()
    a, b = losses(Path(eager["run_dir"])), losses(runs / "compiled")
    assert len(a) == len(b) == 3
    # Inductor fuses and reorders the fp32 reductions, so the losses agree to rounding, not bitwise: a few float32
    # eps (1.2e-7) per reassociated sum, grown a little by two AdamW steps (seen: 1e-7 to 2e-7). rel 1e-5 leaves
    # 50x that margin; a wrongly compiled graph (a missing op, a wrong shape guard) is off by 1e-3 or more.
    assert b == pytest.approx(a, rel=1e-5)


# ---- no host sync per step -----------------------------------------------------------------------------------------


def _forbid_host_reads(monkeypatch) -> list[str]:
    """Make every read of a tensor's value by the host fail outside torch.optim (whose CPU step counters are host
    scalars, not device syncs); returns the reads seen."""
    seen: list[str] = []

    def guard(name: str) -> Any:
        original = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not caller.startswith("torch.optim"):
                seen.append(f"{name} from {caller}")
                raise AssertionError(f"host read of a tensor ({name}) from {caller}")
            return original(self, *args, **kwargs)

        return read

    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, guard(name))
    return seen


@pytest.mark.parametrize("exp", ["base", "global+pen"])
def test_a_train_step_reads_no_tensor_value_on_the_host(runs: Path, monkeypatch, exp: str) -> None:
    tr = Trainer(tiny_cfg(runs, f"exp={exp}"))
    inputs, targets, _ = next(iter(tr.loader(0)))
    seen = _forbid_host_reads(monkeypatch)
    terms = tr.train_step(inputs, targets)
    with pytest.raises(AssertionError, match="host read"):  # the guard sees a read: the flag check's, once due
        tr.check_flags()
    monkeypatch.undo()
    seen.pop()
    assert seen == [] and "loss" in terms
    assert int(tr._first_bad) == 0  # recorded on the device: finite


def _poison_after(step: int):
    def poison(tr: Trainer) -> None:
        if tr.progress.step == step:
            with torch.no_grad():
                tr.model.backbone.blocks[0].attn.qkv.weight.fill_(float("nan"))

    return poison


@pytest.mark.parametrize("ckpt_every", [3, 100])  # a save before the next log step, or none
def test_a_nan_between_checks_is_caught_later_named_by_its_step_and_never_saved(runs: Path, ckpt_every: int) -> None:
    cfg = tiny_cfg(runs, "name=lag", "train.log_every=4", f"train.ckpt_every={ckpt_every}")  # 4 steps an epoch
    with pytest.raises(NonFiniteLoss, match=r"non-finite loss at step 2: loss=nan sigreg=nan") as err:
        Trainer(cfg).fit(on_step=_poison_after(1))  # step 2 is the first with a NaN loss; no check at 2 or 3
    assert "no checkpoint was written yet" in str(err.value)
    assert not list((runs / "lag").glob("checkpoints/*.pt"))
    assert all(m["step"] < 2 for m in read_metrics(runs / "lag"))  # nothing of the bad steps was logged


def test_a_nan_after_a_good_checkpoint_keeps_it(runs: Path) -> None:
    cfg = tiny_cfg(runs, "name=keep", "train.log_every=4", "train.ckpt_every=2")
    with pytest.raises(NonFiniteLoss, match=r"step 3: loss=nan") as err:
        Trainer(cfg).fit(on_step=_poison_after(2))
    assert "checkpoints/last.pt is the last good checkpoint" in str(err.value)
    state = ckpt.load(runs / "keep/checkpoints/last.pt")
    assert state["progress"]["step"] == 2 and not ckpt.non_finite(state["model"])


# ---- throughput and the wait for data ------------------------------------------------------------------------------


def test_throughput_counts_the_wait_for_data_and_leaves_the_callbacks_out(runs: Path, monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    tr = Trainer(tiny_cfg(runs, "name=clock", "data.num_workers=0"))  # 4 steps an epoch, 2 epochs, log every step
    collate, step, validate = tr.objective.collate, tr.train_step, tr.objective.validate

    def slow_collate(items: list) -> Any:  # the loader: 1 s a batch
        now[0] += 1.0
        return collate(items)

    def slow_step(*args: Any) -> Any:  # the step: 2 s
        now[0] += 2.0
        return step(*args)

    def slow_validate(*args: Any) -> Any:  # a callback: 100 s, in neither
        now[0] += 100.0
        return validate(*args)

    tr.objective.collate, tr.train_step, tr.objective.validate = slow_collate, slow_step, slow_validate
    tr.fit()
    logged = [m for m in read_metrics(runs / "clock") if "loss" in m]
    assert len(logged) == 8
    for m in logged:  # 16 images in 3 s of loop time, a third of it waiting for the loader
        assert m["img_per_s"] == pytest.approx(16 / 3) and m["data_wait"] == pytest.approx(1 / 3)


# ---- several ranks -------------------------------------------------------------------------------------------------


def _flags_worker(rank: int, world: int, report, runs: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    tr = Trainer(tiny_cfg(Path(runs), "name=stop", "train.log_every=2", "data.train_size=256"))
    assert isinstance(tr.net, DistributedDataParallel)
    assert tr.net.gradient_as_bucket_view and tr.net.static_graph

    def stop(t: Trainer) -> None:  # only rank 1 is signalled, after step 1
        if rank == 1 and t.progress.step == 1:
            t.request_stop()

    summary = tr.fit(on_step=stop)
    report(f"stopped at {summary['step']} {summary['status']}")  # the next check, step 2, on both ranks
    # nothing crosses the ranks in the forward (per-rank BatchNorm and SIGReg): rank 0's loss stays finite at step 2
    tr = Trainer(tiny_cfg(Path(runs), "name=nan", "train.log_every=4", "data.train_size=256",
                          "objective.projector_bn=per_rank", "objective.sigreg=pooled_per_rank"))
    try:
        tr.fit(on_step=_poison_after(1) if rank == 1 else None)  # rank 1's loss is NaN at step 2
    except NonFiniteLoss as err:
        report(str(err).split(". Training stopped")[0])


@pytest.mark.slow
def test_every_rank_stops_after_the_same_step_and_names_the_first_bad_step(tmp_path: Path) -> None:
    reports = run_ranks(_flags_worker, str(tmp_path / "runs"))
    said = {(rank, what) for rank, what in reports}
    assert {(0, "stopped at 2 interrupted"), (1, "stopped at 2 interrupted")} <= said
    # rank 0's own loss turns NaN a step later (the averaged gradients carry rank 1's NaN): both name step 2
    assert any(r == 1 and what.startswith("non-finite loss at step 2: loss=nan sigreg=nan") for r, what in said)
    assert (0, "non-finite loss at step 2: on another rank") in said


def _weights_worker(rank: int, world: int, report, runs: str) -> None:
    tr = Trainer(tiny_cfg(Path(runs), "name=nanw", "train.ckpt_every=2", "train.log_every=2", "data.train_size=256"))

    def diverging_update(optimizer, args, kwargs) -> None:  # rank 0's update blows its weights up, the loss was finite
        if rank == 0 and tr.progress.step == 1:  # the step about to become step 2, a checkpoint step
            with torch.no_grad():
                tr.model.backbone.blocks[1].mlp.fc1.weight.fill_(float("inf"))

    tr.optimizer.register_step_post_hook(diverging_update)
    try:
        tr.fit()
    except NonFiniteLoss as err:
        report(str(err).split(" (the loss")[0])


@pytest.mark.slow
def test_weights_refused_on_rank_0_stop_every_rank(tmp_path: Path) -> None:
    # only rank 0 saves, so only it sees its weights: a rank that ran on would wait in the next all-reduce
    reports = run_ranks(_weights_worker, str(tmp_path / "runs"))
    said = sorted((rank, what) for rank, what in reports if "weights" in what)
    assert said == [(0, "the weights are not finite at step 2"), (1, "the weights are not finite at step 2")]
    assert not list((tmp_path / "runs" / "nanw" / "checkpoints").glob("*.pt"))


def _sink_task_worker(rank: int, world: int, report, runs: str) -> None:
    from vitsinks.configs.schema import load_config
    from vitsinks.utils.distributed import gather_objects

    cfg = load_config(["data=sinktask_nop", f"runs_dir={runs}", "wandb.mode=disabled", "train.max_steps=3",
                       "data.train_size=256", "data.val_size=64", "diagnostics.enabled=false", "train.batch_size=32"])
    tr = Trainer(cfg)
    summary = tr.fit()
    weights = torch.cat([p.detach().flatten() for p in tr.model.parameters()])
    both = gather_objects(weights)
    report(f"{summary['step']} {torch.equal(both[0], both[1])}")


@pytest.mark.slow
def test_a_model_with_a_parameter_it_never_uses_trains_on_two_ranks(tmp_path: Path) -> None:
    # the residual-stream regression never uses the backbone's final norm: DDP without static_graph (and without
    # its per-step search for unused parameters) stops at the second step; with it, the replicas stay equal
    reports = run_ranks(_sink_task_worker, str(tmp_path))
    assert sorted(what for _, what in reports if what[0].isdigit()) == ["3 True", "3 True"]


def test_the_paper_recipe_compiles_and_saves_once_per_epoch() -> None:
    from vitsinks.configs.schema import load_config

    default, paper = load_config([]).train, load_config(["recipe=paper"]).train
    assert not default.compile and paper.compile
    assert paper.ckpt_every == 1_281_167 // paper.batch_size  # ImageNet-1k's train images: the steps of an epoch
    assert paper.periodic_weights_only and not default.periodic_weights_only
