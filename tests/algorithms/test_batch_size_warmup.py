"""BatchSizeWarmup: trimming against explicit slicing, the schedule worked out by hand, refusals, and real Trainers."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple
from pathlib import Path
from typing import Any

import lightning.pytorch
import pytest
import pytorch_lightning
import torch
import torch.nn.functional as F
from helpers.support import assert_same_weights
from helpers.two_processes import saved_by_each_rank
from torch.utils.data import DataLoader, TensorDataset

import composer_bridge
import composer_bridge.pl
from composer_bridge import AlgorithmEngineCallback, Engine, Event, State
from composer_bridge.algorithms import BatchSizeWarmup
from composer_bridge.algorithms.batch_size_warmup import batch_size_of
from composer_bridge.core.algorithm import AlgorithmError
from composer_bridge.functional import set_batch_size

PACKAGES = {"lightning.pytorch": lightning.pytorch, "pytorch_lightning": pytorch_lightning}
FLAVOURS = {"lightning.pytorch": composer_bridge, "pytorch_lightning": composer_bridge.pl}
Pair = namedtuple("Pair", "inputs targets")


# --- the functional form against explicit slicing --------------------------------------------------
def test_a_dict_batch_keeps_the_first_n_rows_of_every_tensor_of_the_batch_size() -> None:
    x, y, mask = torch.randn(6, 3, 4), torch.arange(6), torch.ones(6, 4)
    weight = torch.tensor(0.5)  # 0-d: no examples
    batch = {"x": x, "y": y, "mask": mask, "weight": weight, "name": "digits"}
    cut = set_batch_size(batch, 2)
    for key in ("x", "y", "mask"):
        assert torch.equal(cut[key], batch[key][:2]), key
    assert cut["weight"] is weight and cut["name"] == "digits"
    assert list(cut) == list(batch)
    assert batch["x"] is x and batch["y"].shape == (6,), "the input batch is unchanged"


@pytest.mark.parametrize("kind", [tuple, list, Pair])
def test_tuples_lists_and_named_tuples_keep_their_type(kind: Any) -> None:
    x, y = torch.randn(8, 2), torch.arange(8)
    batch = kind(x, y) if kind is Pair else kind([x, y])
    cut = set_batch_size(batch, 3)
    assert type(cut) is kind
    assert torch.equal(cut[0], x[:3]) and torch.equal(cut[1], y[:3])


def test_a_single_tensor_and_nested_containers_are_cut_like_slicing() -> None:
    x = torch.arange(20).view(10, 2)
    assert torch.equal(set_batch_size(x, 4), x[:4])
    nested = {"inputs": (x, {"ids": x[:, 0]}), "labels": OrderedDict(a=x[:, 1])}
    cut = set_batch_size(nested, 4)
    assert torch.equal(cut["inputs"][0], x[:4]) and torch.equal(cut["inputs"][1]["ids"], x[:4, 0])
    assert type(cut["labels"]) is OrderedDict and torch.equal(cut["labels"]["a"], x[:4, 1])
    keyed = set_batch_size(defaultdict(list, x=x), 4)  # a dict subclass is copied, its extras kept
    assert type(keyed) is defaultdict and keyed.default_factory is list and torch.equal(keyed["x"], x[:4])


def test_a_batch_whose_tensors_disagree_is_refused_naming_each_first_dimension() -> None:
    assert batch_size_of((torch.tensor(1.0), torch.zeros(4, 3), torch.zeros(4))) == 4  # a 0-d tensor has no examples
    # a graph batch: node features, an edge index, the graph of each node, one label per graph
    graphs = {"x": torch.zeros(7, 3), "edge_index": torch.tensor([[0, 5], [6, 1]]), "batch": torch.zeros(7),
              "y": torch.zeros(2)}
    with pytest.raises(ValueError, match=r"disagree on their first dimension \(batch\['x'\]: 7, "
                                         r"batch\['edge_index'\]: 2, batch\['batch'\]: 7, batch\['y'\]: 2\).*Fix"):
        set_batch_size(graphs, 1)


def test_keeping_as_many_examples_as_the_batch_has_returns_the_batch_itself() -> None:
    batch = (torch.zeros(4, 2), torch.zeros(4))
    assert set_batch_size(batch, 4) is batch and set_batch_size(batch, 9) is batch


NO_EXAMPLES = [
    ({"text": ["a", "b"], "label": [0, 1]}, "got a dict {'text': list, 'label': list}"),
    (("a", "b"), "got a tuple of (str, str)"),
    (torch.tensor(3.0), "got a 0-d tensor"),
    (None, "got a NoneType"),
]


@pytest.mark.parametrize(("batch", "described"), NO_EXAMPLES)
def test_a_batch_without_tensors_of_examples_is_refused_naming_its_type_and_the_fix(
    batch: Any, described: str
) -> None:
    with pytest.raises(ValueError, match="examples along the first dimension of its tensors") as info:
        set_batch_size(batch, 1)
    message = str(info.value)
    assert (
        described in message and "Expected a tensor, a dict or a tuple/list" in message and "Fix:" in message
    )
    state = State(torch.nn.Linear(1, 1), algorithms=[BatchSizeWarmup(duration="4ba")])
    state.batch = batch
    with pytest.raises(AlgorithmError) as raised:  # the algorithm refuses the same way, during the warmup
        Engine(state).run_event(Event.AFTER_DATALOADER)
    assert isinstance(raised.value.error, ValueError) and str(raised.value.error) == message


@pytest.mark.parametrize("n", [0, -1, 2.0, True])
def test_set_batch_size_refuses_a_bad_count(n: Any) -> None:
    with pytest.raises(ValueError, match=r"set_batch_size\(n="):
        set_batch_size(torch.zeros(4), n)


# --- the schedule, worked out by hand ---------------------------------------------------------------
def kept_sizes(
    algorithm: BatchSizeWarmup, batch_size: int, steps: int, **state_kwargs: Any
) -> list[int | str]:
    """The batch size at AFTER_DATALOADER for steps 0, 1, ...; "same" where the very batch object came back."""
    state = State(torch.nn.Linear(1, 1), algorithms=[algorithm], **state_kwargs)
    engine, sizes = Engine(state), []
    for _ in range(steps):
        batch = (torch.randn(batch_size, 3), torch.arange(batch_size))
        state.batch = batch
        engine.run_event(Event.AFTER_DATALOADER)
        if state.batch is batch:
            sizes.append("same")
        else:
            assert torch.equal(state.batch[0], batch[0][: len(state.batch[1])])  # the first n examples
            assert torch.equal(state.batch[1], torch.arange(len(state.batch[1])))
            sizes.append(len(state.batch[1]))
        state.timestamp = state.timestamp.to_next_batch(samples=batch_size)
    return sizes


def test_the_kept_size_grows_linearly_from_initial_to_the_whole_batch() -> None:
    # fraction = 0.25 + 0.75 * step / 8; n = ceil(fraction * 16):
    # 4, 5.5 -> 6, 7, 8.5 -> 9, 10, 11.5 -> 12, 13, 14.5 -> 15; from step 8 on the batch is untouched
    assert kept_sizes(BatchSizeWarmup(duration="8ba"), 16, 10) == [4, 6, 7, 9, 10, 12, 13, 15, "same", "same"]
    # multiple_of=4 rounds those down to multiples of 4 (at least 4)
    rounded = [4, 4, 4, 8, 8, 12, 12, 12, "same"]
    assert kept_sizes(BatchSizeWarmup(duration="8ba", multiple_of=4), 16, 9) == rounded


def test_a_fraction_of_the_run_counts_optimizer_steps_of_the_run() -> None:
    # 4 epochs of 5 steps; duration 0.5 -> 10 steps; fraction = 0.5 + 0.5 * step / 10; n = ceil(fraction * 10)
    algorithm = BatchSizeWarmup(duration=0.5, initial=0.5)
    assert algorithm.needs_run_length and not BatchSizeWarmup(duration="3ep").needs_run_length
    sizes = kept_sizes(algorithm, 10, 12, max_duration="4ep", dataloader_len=5)
    assert sizes == [5, 6, 6, 7, 7, 8, 8, 9, 9, "same", "same", "same"]  # ceil(9.5) = 10 is the whole batch
    # 2 epochs of 5 steps -> 10 steps, the same schedule
    assert kept_sizes(BatchSizeWarmup(duration="2ep", initial=0.5), 10, 12, dataloader_len=5) == sizes


def test_small_batches_and_float_products_round_as_documented() -> None:
    one_step = "1ba"
    # 0.07 * 100 is 7.000000000000001 in floats: still 7 examples
    assert kept_sizes(BatchSizeWarmup(duration=one_step, initial=0.07), 100, 1) == [7]
    assert kept_sizes(BatchSizeWarmup(duration=one_step, initial=0.25), 3, 1) == [1]  # ceil(0.75)
    # never below one example, never above the batch (a multiple of 8 of a batch of 4: the whole batch)
    assert kept_sizes(BatchSizeWarmup(duration=one_step, initial=0.01), 1, 1) == ["same"]
    assert kept_sizes(BatchSizeWarmup(duration=one_step, multiple_of=8), 4, 1) == ["same"]


def test_the_schedule_is_a_function_of_the_timestamp_only() -> None:
    algorithm = BatchSizeWarmup(duration="8ba")
    state = State(torch.nn.Linear(1, 1), algorithms=[algorithm])
    state.timestamp = state.timestamp.to_next_batches(3, samples=48)
    twin = BatchSizeWarmup(duration="8ba")  # a fresh instance, as after loading a checkpoint
    assert algorithm.current_fraction(state) == twin.current_fraction(state) == 0.25 + 0.75 * 3 / 8
    assert algorithm.state_dict() == {}  # nothing else to save


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"duration": 0}, "duration"),
        ({"duration": "0ba"}, "duration"),
        ({"duration": 1.5}, "duration"),
        ({"duration": "10sp"}, "duration"),
        ({"initial": 0.0}, "initial"),
        ({"initial": 1.5}, "initial"),
        ({"initial": "half"}, "initial"),
        ({"multiple_of": 0}, "multiple_of"),
        ({"multiple_of": 2.0}, "multiple_of"),
        ({"multiple_of": True}, "multiple_of"),
    ],
)
def test_bad_hyperparameters_are_named_with_the_value_and_what_is_allowed(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=rf"BatchSizeWarmup\({name}=") as info:
        BatchSizeWarmup(**kwargs)
    assert repr(kwargs[name]) in str(info.value)


def test_repr_evaluates_back() -> None:
    algorithm = BatchSizeWarmup(duration="100ba", initial=0.5, multiple_of=8)
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.hparams() == {"duration": "100ba", "initial": 0.5, "multiple_of": 8}


# --- real Trainers of both Lightning packages --------------------------------------------------------
def loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(80, 4, generator=g), torch.randint(0, 3, (80,), generator=g)
    return DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8), DataLoader(
        TensorDataset(x[64:], y[64:]), batch_size=8
    )


def composer_module(name: str, seen: dict[str, list[int]]) -> Any:
    class Classifier(FLAVOURS[name].ComposerModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 3)

        def forward(self, batch: Any) -> torch.Tensor:
            seen["train" if self.training else "val"].append(len(batch[0]))
            return self.net(batch[0])

        def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
            return F.cross_entropy(outputs, batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Classifier()


def plain_module(name: str, seen: dict[str, list[int]]) -> Any:
    class Plain(PACKAGES[name].LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 3)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            seen["train"].append(len(x))
            return F.cross_entropy(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            seen["val"].append(len(batch[0]))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Plain()


def fit(name: str, make_module: Any, accumulate: int = 1) -> tuple[dict[str, list[int]], Any]:
    seen: dict[str, list[int]] = {"train": [], "val": []}
    callback = AlgorithmEngineCallback([BatchSizeWarmup(duration="4ba", initial=0.25)])
    trainer = PACKAGES[name].Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        max_steps=6,
        limit_val_batches=2,
        val_check_interval=3,
        accumulate_grad_batches=accumulate,
        callbacks=[callback],
    )
    trainer.fit(make_module(name, seen), *loaders())
    return seen, callback


@pytest.mark.parametrize("name", list(PACKAGES))
@pytest.mark.parametrize(
    "make_module", [composer_module, plain_module], ids=["ComposerModule", "LightningModule"]
)
def test_the_training_step_sees_the_scheduled_batch_sizes_in_a_real_trainer(
    name: str, make_module: Any
) -> None:
    seen, callback = fit(name, make_module)
    # fraction = 0.25 + 0.75 * step / 4 of 8 examples: 2, 3.5 -> 4, 5, 6.5 -> 7, then the whole batch
    assert seen["train"] == [2, 4, 5, 7, 8, 8]
    assert seen["val"] == [8, 8, 8, 8], "evaluation batches are never trimmed"
    timestamp = callback.state.timestamp
    assert int(timestamp.batch) == 6 and int(timestamp.sample) == 48, "samples are counted as loaded"


def test_micro_batches_of_one_optimizer_step_are_trimmed_alike_under_gradient_accumulation() -> None:
    seen, callback = fit("lightning.pytorch", plain_module, accumulate=2)
    assert seen["train"] == [2, 2, 4, 4, 5, 5, 7, 7, 8, 8, 8, 8]  # the schedule counts optimizer steps
    assert int(callback.state.timestamp.batch) == 6


DDP_SCRIPT = """
import torch, torch.nn.functional as F, lightning.pytorch as L
from torch.utils.data import DataLoader, TensorDataset
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import BatchSizeWarmup

class Plain(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net, self.loaded, self.seen = torch.nn.Linear(4, 3), [], []

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.loaded.append(batch[0].clone())  # the user's hook runs before the bridge trims
        return batch

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[0].clone())
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g))
module = Plain()
trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=4, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[AlgorithmEngineCallback([BatchSizeWarmup(duration="3ba", initial=0.25)])])
trainer.fit(module, DataLoader(data, batch_size=8))
torch.save({"loaded": module.loaded, "seen": module.seen,
            "weights": {k: v.detach() for k, v in module.named_parameters()}}, f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_every_ddp_rank_keeps_the_same_number_of_its_own_first_examples(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    for rank in ranks:
        # fraction = 0.25 + 0.75 * step / 3 of each rank's 8 examples: 2, 4, 6, then all 8
        assert [len(x) for x in rank["seen"]] == [2, 4, 6, 8]
        for loaded, seen in zip(rank["loaded"], rank["seen"], strict=True):
            assert len(loaded) == 8  # the rank loaded its whole batch ...
            assert torch.equal(seen, loaded[: len(seen)])  # ... and trained on its first examples
    # each rank has its own examples
    for first, second in zip(ranks[0]["loaded"], ranks[1]["loaded"], strict=True):
        assert not (first[:, None, :] == second[None, :, :]).all(-1).any()
    assert_same_weights(ranks[0]["weights"], ranks[1]["weights"])
