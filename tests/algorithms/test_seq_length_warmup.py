"""SeqLengthWarmup: sequence cutting against explicit slicing, the schedule, and a real Trainer run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.support import quiet_trainer

from composer_bridge import Algorithm, AlgorithmEngineCallback, ComposerModule, Event, State
from composer_bridge.algorithms.seq_length_warmup import SeqLengthWarmup, set_batch_sequence_length


def test_truncation_and_recutting_match_explicit_slicing() -> None:
    ids = torch.arange(30).view(3, 10)
    batch = {"input_ids": ids, "labels": ids + 100, "lengths": torch.tensor([10, 10, 10])}
    cut = set_batch_sequence_length(batch, 4)
    assert torch.equal(cut["input_ids"], torch.stack([row[:4] for row in ids]))
    assert torch.equal(cut["labels"], torch.stack([row[:4] for row in ids + 100]))
    assert cut["lengths"] is batch["lengths"], "1-D tensors are not sequences"
    recut = set_batch_sequence_length(batch, 4, truncate=False)
    tokens = ids.flatten()[:28]
    assert torch.equal(recut["input_ids"], torch.stack([tokens[i : i + 4] for i in range(0, 28, 4)]))
    x, y = set_batch_sequence_length((ids, ids + 1), 7)
    assert x.shape == y.shape == (3, 7)


def test_preserve_end_of_sequence_keeps_each_rows_last_real_token_as_its_last_kept_token() -> None:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([10, 3, 6, 1, 0])
    mask = (torch.arange(10)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, 1000, (5, 10), generator=g) * mask
    embeds = torch.randn(5, 10, 2, generator=g)  # a sequence tensor with a trailing feature dimension
    batch = {"input_ids": ids, "attention_mask": mask, "embeds": embeds, "row": torch.arange(5)}
    before = {k: v.clone() for k, v in batch.items()}
    cut = set_batch_sequence_length(batch, 4, preserve_end_of_sequence=True)
    for key in ("input_ids", "attention_mask", "embeds"):
        for row, n in enumerate(lengths.tolist()):
            expected = before[key][row, :4].clone()
            if n > 4:  # the cut removed the last real token: it replaces the last kept one
                expected[3] = before[key][row, n - 1]
            assert torch.equal(cut[key][row], expected), (key, row)
    assert all(torch.equal(batch[k], before[k]) for k in batch), "the input batch is not modified"
    plain = set_batch_sequence_length(batch, 4, truncate=False, preserve_end_of_sequence=True)  # ignored, as Composer
    assert torch.equal(plain["input_ids"], set_batch_sequence_length(batch, 4, truncate=False)["input_ids"])
    with pytest.raises(ValueError, match="attention_mask"):
        set_batch_sequence_length({"input_ids": ids}, 4, preserve_end_of_sequence=True)
    with pytest.raises(ValueError, match="attention_mask"):
        set_batch_sequence_length((ids, ids), 4, preserve_end_of_sequence=True)
    algorithm = SeqLengthWarmup(duration="1ba", min_seq_length=4, max_seq_length=4, preserve_end_of_sequence=True)
    assert eval(repr(algorithm)) == algorithm and algorithm.preserve_end_of_sequence


def test_schedule_grows_linearly_in_steps_of_step_size() -> None:
    algorithm = SeqLengthWarmup(duration="8ba", min_seq_length=4, max_seq_length=16, step_size=4)
    state = State(torch.nn.Linear(1, 1))
    lengths = []
    for _ in range(10):
        lengths.append(algorithm.current_length(state))
        state.timestamp = state.timestamp.to_next_batch()
    assert lengths == [4, 4, 8, 8, 12, 12, 16, 16, 16, 16]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"duration": 2.0}, "duration"), ({"duration": "10sp"}, "duration"), ({"min_seq_length": 0}, "min_seq_length"),
     ({"step_size": 1.5}, "step_size"), ({"min_seq_length": 64, "max_seq_length": 8}, "max_seq_length"),
     ({"preserve_end_of_sequence": 1}, "preserve_end_of_sequence")],
)
def test_bad_hyperparameters_are_named(kwargs: dict, name: str) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        SeqLengthWarmup(**kwargs)


def test_repr_evaluates_back() -> None:
    a = SeqLengthWarmup(duration="0.5dur", min_seq_length=4, max_seq_length=32)
    assert eval(repr(a)) == a


class TokenModel(ComposerModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.head(self.embed(batch["input_ids"]))

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs.flatten(0, 1), batch["labels"].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_training_sees_growing_sequences_in_a_real_trainer() -> None:
    seen: list[int] = []

    class Probe(Algorithm):
        def match(self, event: Event, state: State) -> bool:
            return event == Event.BEFORE_FORWARD

        def apply(self, event: Event, state: State, logger: Any) -> None:
            seen.append(state.batch["input_ids"].shape[1])

    tokens = torch.randint(0, 16, (64, 33), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    warmup = SeqLengthWarmup(duration=0.5, min_seq_length=8, max_seq_length=32, step_size=8)
    quiet_trainer(max_steps=8, callbacks=[AlgorithmEngineCallback([warmup, Probe()])]).fit(TokenModel(), loader)
    assert seen == [8, 16, 24, 32, 32, 32, 32, 32]
