"""FSDP2 (Lightning's ModelParallelStrategy, ``fully_shard`` in ``configure_model``) on 2 CPU processes, DDP as the oracle.

One process launch (``fsdp_runs.py``, 2 ranks on gloo) trains every case under DDP and under FSDP2
with the same seeds and data, then resumes from sharded and full-state-dict checkpoints, logs
traces to W&B (offline) and fits a model that is already sharded with a surgery algorithm. The
tests below read what each rank recorded. A few single-process checks (a 1-rank process group)
need no launch.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers.support import REPO, assert_same_state, run_ddp_file, wandb_run_records
from helpers.two_processes import rank_files

from composer_bridge.algorithms import EMA, SWA, BlurPool
from composer_bridge.algorithms._sharding import full_tensor, is_dtensor, like
from composer_bridge.algorithms.ema import ema_weights_from_checkpoint
from composer_bridge.core import torch_versions
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State
from composer_bridge.functional import apply_blurpool

SCRIPT = REPO / "tests" / "helpers" / "fsdp_runs.py"
#: surgery case -> a class the surgery creates
SURGERY = {"BlurPool": "BlurConv2d", "SqueezeExcite": "SqueezeExciteConv2d", "Factorize": "FactorizedConv2d",
           "GatedLinearUnits": "GatedFeedForward", "StochasticDepth": "StochasticBlock",
           "GhostBatchNorm": "GhostBatchNormWrapper", "WeightStandardization": "ParametrizationList",
           "LowPrecisionGroupNorm": "LPGroupNorm", "LowPrecisionLayerNorm": "LPLayerNorm",
           "Alibi": "AlibiCausalSelfAttention", "GyroDropout": "GyroDropoutLayer", "QKNorm": "QKNormProjection"}
#: batch and loss algorithms on the image classifier (whose training inputs are recorded)
BATCH_AND_LOSS = [
    "LabelSmoothing",
    "MixUp",
    "CutMix",
    "CutOut",
    "SelectiveBackprop",
    "ProgressiveResizing",
    "ZLoss",
    "BatchSizeWarmup",
]
SEQUENCE = ["SeqLengthWarmup"]  # on the language model
WEIGHTS = ["EMA", "SWA", "LayerFreezing", "SAM", "GradientClipping-norm", "GradientClipping-value",
           "GradientClipping-adaptive"]
AUGMENTATION = ["RandAugment", "AugMix", "ColOut"]
#: (run, checkpoint) resumed at an epoch's last batch; "plain": Lightning alone, the oracle (fsdp_runs.EPOCH_END_RUNS)
EPOCH_END_RUNS = [("plain", "sharded"), ("CutOut", "sharded"), ("MixUp", "sharded"), ("plain", "full"),
                  ("CutOut", "full"), ("MixUp", "full")]
#: refused under ModelParallelStrategy at setup (test_surgery_on_an_already_sharded_model_is_refused_on_every_rank)
REFUSED = ["ChannelsLast"]
#: not launched here: Muon refuses sharded matrices at fit start (tests/algorithms/test_muon.py); ScheduleFree and
#: WarmupStableDecay act on the optimizer only (its modes, its learning rate) and are not run under FSDP2 yet
OPTIMIZER_OWNERS = ["Muon", "ScheduleFree", "WarmupStableDecay"]
#: not launched here either: Compile (torch.compile in place before the strategy shards the model) is not run under
#: FSDP2 yet (docs/algorithms/compile.md says so)
NOT_RUN_YET = ["Compile"]


# --- the launched runs ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every rank's results (``[rank0, rank1]``) of one launch of ``fsdp_runs.py``."""
    if not torch_versions.fsdp2_runs_on_cpu():
        pytest.skip(f"FSDP2 trains on CPU processes from torch {'.'.join(map(str, torch_versions.FSDP2_ON_CPU))} on; this is torch "
                    f"{torch.__version__} (core/torch_versions.py; the bridge refuses it at setup, tested below)")
    out = tmp_path_factory.mktemp("fsdp2")
    result = run_ddp_file(SCRIPT, [str(out)], out, timeout=840, extra_env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    ranks = rank_files(result, out, weights_only=False)
    for rank in ranks:
        rank["out"] = out
    return ranks


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], where: str) -> None:
    assert a.keys() == b.keys(), f"{where}: {sorted(set(a) ^ set(b))}"
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=lambda m, k=key: f"{where} {k}: {m}")


def _params_match_ddp(runs: list[dict[str, Any]], case: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Final parameters (gathered) of FSDP2 equal DDP's on both ranks; returns rank 0's (ddp, fsdp2) records."""
    for rank in (0, 1):
        ddp, fsdp2 = runs[rank]["cases"][f"{case}/ddp"], runs[rank]["cases"][f"{case}/fsdp2"]
        assert fsdp2["sharded"] and not ddp["sharded"], case  # the FSDP2 run really trained DTensor shards
        _close(ddp["params"], fsdp2["params"], f"{case} rank {rank}")
        assert ddp["norms_before"] == pytest.approx(fsdp2["norms_before"], rel=1e-5), case
        assert ddp["norms_after"] == pytest.approx(fsdp2["norms_after"], rel=1e-5), case
    for key, value in runs[0]["cases"][f"{case}/ddp"]["params"].items():  # DDP keeps its replicas equal
        assert torch.equal(value, runs[1]["cases"][f"{case}/ddp"]["params"][key]), (case, key)
    assert len(runs[0]["cases"][f"{case}/fsdp2"]["norms_after"]) >= 4, case  # it trained
    return runs[0]["cases"][f"{case}/ddp"], runs[0]["cases"][f"{case}/fsdp2"]


@pytest.mark.timeout(900)
def test_surgery_runs_before_sharding_and_trains_like_ddp(runs: list[dict[str, Any]]) -> None:
    for case, replaced in SURGERY.items():
        ddp, fsdp2 = _params_match_ddp(runs, case)
        assert replaced in ddp["classes"], case
        # Lightning called configure_model after the callbacks' setup (INIT): fully_shard saw the new layers
        assert replaced in fsdp2["classes_at_configure_model"], (case, fsdp2["classes_at_configure_model"])
        # configure_model sharded the replaced model: FSDP2 renames each sharded class FSDP<Name>
        assert any(name.startswith("FSDP") for name in fsdp2["classes"]), fsdp2["classes"]
        assert {replaced, f"FSDP{replaced}"} & set(fsdp2["classes"]), (case, fsdp2["classes"])


@pytest.mark.timeout(900)
def test_batch_and_loss_algorithms_draw_per_rank_as_under_ddp(runs: list[dict[str, Any]]) -> None:
    for case in BATCH_AND_LOSS + AUGMENTATION:
        _params_match_ddp(runs, case)
        inputs = [runs[r]["cases"][f"{case}/fsdp2"]["train_inputs"] for r in (0, 1)]
        # each rank trains on what it trained on under DDP (same draws, same data) ...
        assert inputs == [runs[r]["cases"][f"{case}/ddp"]["train_inputs"] for r in (0, 1)], case
        assert inputs[0] != inputs[1], case  # ... and ranks differ, as under DDP
    plain = runs[0]["cases"]["LabelSmoothing/fsdp2"]["train_inputs"]  # the inputs before any mixing
    for case in (
        "MixUp",
        "CutMix",
        "CutOut",
        "RandAugment",
        "AugMix",
        "ColOut",
        "SelectiveBackprop",
        "ProgressiveResizing",
        "BatchSizeWarmup",
    ):
        assert runs[0]["cases"][f"{case}/fsdp2"]["train_inputs"] != plain, f"{case} did not change the batch"
    for case in SEQUENCE:
        _params_match_ddp(runs, case)


def test_the_cases_cover_every_algorithm_of_the_library() -> None:
    import composer_bridge.algorithms as library
    from composer_bridge.core.algorithm import Algorithm

    names = {n for n in library.__all__ if isinstance(getattr(library, n), type)
             and issubclass(getattr(library, n), Algorithm) and not getattr(library, n).__abstractmethods__}
    covered = {*SURGERY, *BATCH_AND_LOSS, *SEQUENCE, *AUGMENTATION, *REFUSED, *OPTIMIZER_OWNERS, *NOT_RUN_YET}
    covered |= {case.split("-")[0] for case in WEIGHTS}
    assert names == covered, sorted(names ^ covered)


@pytest.mark.timeout(900)
def test_gradient_clipping_uses_the_global_norm_of_the_sharded_gradients(runs: list[dict[str, Any]]) -> None:
    for case in ("GradientClipping-norm", "GradientClipping-value", "GradientClipping-adaptive"):
        ddp, fsdp2 = _params_match_ddp(runs, case)
        assert fsdp2["norms_after"] != fsdp2["norms_before"], f"{case} clipped nothing"
    norm = runs[0]["cases"]["GradientClipping-norm/fsdp2"]
    assert min(norm["norms_before"]) > 0.05  # every step needed clipping ...
    assert norm["norms_after"] == pytest.approx([0.05] * len(norm["norms_after"]), rel=1e-4)  # ... to the global 0.05


@pytest.mark.timeout(900)
def test_weight_averaging_freezing_and_sam_match_ddp(runs: list[dict[str, Any]]) -> None:
    for case in ("EMA", "SWA", "LayerFreezing", "SAM"):
        _params_match_ddp(runs, case)
    for rank in (0, 1):
        ddp, fsdp2 = runs[rank]["cases"]["EMA/ddp"], runs[rank]["cases"]["EMA/fsdp2"]
        params = set(ddp["params"])
        assert ddp["ema"] is not None and params <= set(ddp["ema"])
        # the averages of the parameters; BatchNorm statistics are per rank under FSDP2 (DDP copies rank 0's)
        _close({k: ddp["ema"][k] for k in params}, {k: fsdp2["ema"][k] for k in params}, f"EMA rank {rank}")
        swa_ddp, swa_fsdp2 = runs[rank]["cases"]["SWA/ddp"]["swa"], runs[rank]["cases"]["SWA/fsdp2"]["swa"]
        assert swa_ddp is not None
        _close(swa_ddp, swa_fsdp2, f"SWA rank {rank}")
    ema_ddp, ema_fsdp2 = runs[0]["cases"]["EMA/ddp"], runs[0]["cases"]["EMA/fsdp2"]
    _close(ema_ddp["ema"], ema_fsdp2["ema"], "EMA rank 0 with buffers")
    # validation ran twice with the average swapped in, and trained on with the training weights
    assert len(ema_fsdp2["eval_outputs"]) == 4
    assert ema_fsdp2["eval_outputs"] == pytest.approx(ema_ddp["eval_outputs"], rel=1e-5)
    frozen = runs[0]["cases"]["LayerFreezing/fsdp2"]
    assert frozen["trainable"] == runs[0]["cases"]["LayerFreezing/ddp"]["trainable"]
    assert 0 < len(frozen["trainable"]) < len(frozen["params"])
    sam = runs[0]["cases"]["SAM/fsdp2"]
    assert len(sam["norms_before"]) == 2 * 4  # two backward passes per step


@pytest.mark.timeout(900)
def test_sharded_and_full_checkpoints_resume_exactly(runs: list[dict[str, Any]]) -> None:
    def comparable(bridge: dict[str, Any], with_buffers: bool) -> dict[str, Any]:
        bridge = {**bridge, "timestamp": {k: v for k, v in bridge["timestamp"].items() if "wct" not in k}}
        if with_buffers:
            return bridge
        algorithms = []
        for entry in bridge["algorithms"]:
            state = dict(entry["state"])
            if state.get("ema_weights"):
                state["ema_weights"] = {k: v for k, v in state["ema_weights"].items() if "running_" not in k}
            algorithms.append({**entry, "state": state})
        return {**bridge, "algorithms": algorithms}

    for rank in (0, 1):
        results = runs[rank]["checkpoints"]
        for name in ("EMA+MixUp", "SWA+CutMix"):
            for mode in ("sharded", "full"):
                whole, resumed = results[f"{name}/{mode}/uninterrupted"], results[f"{name}/{mode}/resumed"]
                where = f"rank {rank} {name} {mode}"
                for key, value in whole["params"].items():
                    assert torch.equal(value, resumed["params"][key]), f"{where}: {key}"
                assert len(resumed["inputs"]) == 3 and resumed["inputs"] == whole["inputs"][3:], where  # same draws
                # EMA/SWA averages and counters, the timestamp, the seed; BatchNorm statistics are per rank under
                # FSDP2 and a checkpoint keeps one rank's: compared where that rank's are restored (rank 0, full)
                exact = rank == 0 and mode == "full"
                assert_same_state(comparable(whole["bridge"], exact), comparable(resumed["bridge"], exact), where)
                algorithms = {e["class"]: e["state"] for e in whole["bridge"]["algorithms"]}
                averages = algorithms.get("EMA", {}).get("ema_weights") or algorithms.get("SWA", {}).get("average")
                assert averages and not any(is_dtensor(t) for t in averages.values()), where  # whole tensors
        assert results["EMA+MixUp/sharded/uninterrupted"]["checkpoint_files"] == [
            ".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
        assert results["EMA+MixUp/full/uninterrupted"]["checkpoint_files"] is None  # one file
    # the average can be read from either checkpoint without the bridge: whole tensors, the same in both
    out = runs[0]["out"]
    from_sharded = ema_weights_from_checkpoint(out / "EMA+MixUp-sharded" / "at-step=3.ckpt" / "meta.pt")
    from_full = ema_weights_from_checkpoint(out / "EMA+MixUp-full" / "at-step=3.ckpt")
    params = runs[0]["checkpoints"]["EMA+MixUp/full/uninterrupted"]["params"]
    assert params.keys() <= from_sharded.keys() == from_full.keys()
    for key in from_full:
        assert torch.equal(from_sharded[key], from_full[key]), key
    assert all(from_full[k].shape == v.shape for k, v in params.items())


@pytest.mark.timeout(900)
def test_resumes_exactly_from_an_epochs_last_batch_like_plain_lightning(runs: list[dict[str, Any]]) -> None:
    """``ModelCheckpoint(every_n_train_steps=2)`` at epoch 0's last batch (2 epochs of 2 batches), resumed in epoch 1.

    Plain Lightning (no bridge) is the oracle: it resumes exactly at this point, and so must CutOut and
    MixUp: the final parameters (gathered), the bridge's state and every draw after the checkpoint.
    """
    for rank in (0, 1):
        results = runs[rank]["checkpoints"]
        for name, mode in EPOCH_END_RUNS:
            whole = results[f"epoch-end/{name}/{mode}/uninterrupted"]
            resumed = results[f"epoch-end/{name}/{mode}/resumed"]
            where = f"rank {rank} {name} {mode}"
            assert whole["sharded"] and resumed["sharded"], where
            assert whole["global_step"] == resumed["global_step"] == 4, where
            assert whole["params"].keys() == resumed["params"].keys(), where
            for key, value in whole["params"].items():
                assert torch.equal(value, resumed["params"][key]), f"{where}: {key}"
            # the resumed fit trained epoch 1's two batches, with the uninterrupted run's draws
            assert len(resumed["inputs"]) == 2 and resumed["inputs"] == whole["inputs"][2:], where
            if name == "plain":
                assert whole["bridge"] is None and resumed["bridge"] is None
                continue
            timestamps = [{k: v for k, v in r["bridge"]["timestamp"].items() if "wct" not in k} for r in (whole, resumed)]
            assert timestamps[0]["epoch"] == 2 and timestamps[0]["batch"] == 4, (where, timestamps[0])
            assert_same_state({**whole["bridge"], "timestamp": timestamps[0]},
                              {**resumed["bridge"], "timestamp": timestamps[1]}, where)
        # the algorithms changed what the model trained on (the plain run's inputs are the data as loaded)
        plain = results["epoch-end/plain/sharded/uninterrupted"]["inputs"]
        for name in ("CutOut", "MixUp"):
            assert results[f"epoch-end/{name}/sharded/uninterrupted"]["inputs"] != plain, (rank, name)


@pytest.mark.timeout(900)
def test_traces_and_wandb_stay_on_rank_zero(runs: list[dict[str, Any]]) -> None:
    rank0, rank1 = (runs[r]["traces"] for r in (0, 1))
    expected = {"EMA/FIT_START": 1, "EMA/BATCH_START": 2, "EMA/BATCH_END": 2, "MixUp/BEFORE_FORWARD": 2,
                "MixUp/BEFORE_LOSS": 2}
    assert rank0["trace_counts"] == rank1["trace_counts"] == expected  # both ranks ran the algorithms
    traced = {k for k in rank0["logged_keys"] if k.startswith("algorithm_traces/")}
    assert traced == {f"algorithm_traces/{k}" for k in expected}
    assert "sentinel" in rank1["logged_keys"]  # the logger was live on rank 1 ...
    assert not [k for k in rank1["logged_keys"] if k.startswith(("algorithm_", "EMA/"))]  # ... and got nothing from us
    out = runs[0]["out"]
    assert len((out / "traces.txt").read_text().splitlines()) == sum(expected.values())  # written once
    (run_dir,) = (out / "wandb").glob("offline-run-*")  # one W&B run, rank zero's
    keys = {item.key or "/".join(item.nested_key) for r in wandb_run_records(next(run_dir.glob("run-*.wandb")))
            if r.WhichOneof("record_type") == "history" for item in r.history.item}
    assert {f"algorithm_traces/{k}" for k in expected} <= keys


@pytest.mark.timeout(900)
def test_surgery_on_an_already_sharded_model_is_refused_on_every_rank(runs: list[dict[str, Any]]) -> None:
    for rank in (0, 1):
        refusal = runs[rank]["refusal"]
        assert refusal["error"] is not None, "BlurPool changed a sharded model"
        for words in ("BlurPool", "already sharded", "FSDPModule", "configure_model", "before fully_shard"):
            assert words in refusal["error"], (words, refusal["error"])
        assert "BlurConv2d" not in refusal["classes"]  # the model was left as it was
        # ChannelsLast's weights cannot be sharded by fully_shard: refused at setup, before it changes the model
        assert refusal["channels_last_error"] is not None
        for words in ("ChannelsLast", "non-contiguous", "ModelParallelStrategy", "Fix: remove ChannelsLast"):
            assert words in refusal["channels_last_error"], (words, refusal["channels_last_error"])
        assert refusal["fresh_contiguous"]


def test_channels_last_is_refused_under_model_parallel_strategy_at_setup() -> None:
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    from composer_bridge.algorithms import ChannelsLast
    from composer_bridge.lightning.setup_checks import BridgeConfigurationError, check_trainer

    sharded = L.Trainer(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(data_parallel_size=2,
                        tensor_parallel_size=1), logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(BridgeConfigurationError, match="ChannelsLast makes the convolution weights channels-last"):
        check_trainer([ChannelsLast()], sharded)
    ddp = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False)
    assert check_trainer([ChannelsLast()], ddp) == []


def test_fsdp2_on_cpu_processes_is_refused_at_setup_on_a_torch_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.6's FSDP2 fails at the first forward on CPU processes: the bridge says so, with the version, at setup."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    from composer_bridge.algorithms import EMA
    from composer_bridge.lightning.setup_checks import BridgeConfigurationError, check_trainer

    def sharded() -> Any:
        return L.Trainer(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(data_parallel_size=2,
                         tensor_parallel_size=1), logger=False, enable_checkpointing=False, enable_progress_bar=False)

    if torch_versions.fsdp2_runs_on_cpu():
        assert check_trainer([EMA()], sharded()) == []
        monkeypatch.setattr(torch_versions, "FSDP2_ON_CPU", (99, 0))  # what a torch without it sees
    need, have = (re.escape(v) for v in (".".join(map(str, torch_versions.FSDP2_ON_CPU)), torch.__version__))
    with pytest.raises(BridgeConfigurationError, match=rf"trains on CPU processes from torch {need} on; this is torch "
                       rf"{have}, .*Fix: install torch>={need}, train on GPUs, or use strategy='ddp'"):
        check_trainer([EMA()], sharded())


# --- one process: a 1-rank group is enough for DTensor parameters -----------------------------------
@pytest.fixture()
def one_rank_mesh():  # type: ignore[no-untyped-def]
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _sharded_cnn(mesh: Any) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    net(torch.randn(1, 3, 8, 8))
    fully_shard(net[0], mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def test_surgery_refuses_a_sharded_model_with_the_algorithm_what_it_saw_and_the_fix(one_rank_mesh: Any) -> None:
    net = _sharded_cnn(one_rank_mesh)
    state = State(net, algorithms=[BlurPool(min_channels=2)])
    with pytest.raises(RuntimeError, match=r"BlurPool cannot change the model: it is already sharded \(FSDPModule") as info:
        BlurPool(min_channels=2).apply(Event.INIT, state, Logger())
    assert "configure_model" in str(info.value) and "before fully_shard" in str(info.value)
    with pytest.raises(RuntimeError, match="replace_modules cannot change the model: it is already sharded"):
        apply_blurpool(net, min_channels=2)
    assert not any(type(m).__name__ == "BlurConv2d" for m in net.modules())


def test_ema_and_swa_checkpoint_whole_tensors_and_slice_them_again(one_rank_mesh: Any) -> None:
    net = _sharded_cnn(one_rank_mesh)
    state = State(net, algorithms=[])
    ema, swa = EMA(smoothing=0.5), SWA(swa_start="1ba", swa_end="100ba", update_interval="1ba")
    ema._maybe_update(state, Logger())
    swa._update_average(net)
    assert all(is_dtensor(t) for t in ema.ema_weights.values() if t.is_floating_point())  # shards, like the params
    saved_ema, saved_swa = ema.state_dict(), swa.state_dict()
    for tensors in (saved_ema["ema_weights"], saved_swa["average"]):
        assert tensors and not any(is_dtensor(t) for t in tensors.values())
    restored = EMA(smoothing=0.5)
    restored.load_state_dict(saved_ema)
    restored.get_ema_model(net)  # slices the whole tensors like the parameters, then copies them in
    for name, param in net.named_parameters():
        assert is_dtensor(param)
        assert torch.equal(full_tensor(param.detach()), saved_ema["ema_weights"][name])
    weight = net[0].weight
    assert is_dtensor(like(saved_ema["ema_weights"]["0.weight"], weight))


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, torch's FSDP1 wraps the module")
def test_fsdp1_is_refused_on_the_cpu_by_lightning_and_then_by_torch(one_rank_mesh: Any) -> None:
    """What docs/distributed.md quotes: FSDP1 cannot be tried on CPU processes with this torch."""
    import lightning as L
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel

    with pytest.raises(ValueError, match="The strategy `fsdp` requires a GPU accelerator, but received `accelerator='cpu'`"):
        L.Trainer(accelerator="cpu", devices=2, strategy=FSDPStrategy(), logger=False)

    class CPUFSDPStrategy(FSDPStrategy):
        pass

    L.Trainer(accelerator="cpu", devices=2, strategy=CPUFSDPStrategy(), logger=False)  # a subclass passes Lightning
    with pytest.raises(RuntimeError, match="FSDP needs a non-CPU accelerator device, but no accelerator device is detected"):
        FullyShardedDataParallel(torch.nn.Linear(2, 2))  # ... and torch refuses to wrap on the CPU
