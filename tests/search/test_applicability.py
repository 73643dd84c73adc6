"""Which algorithms the search offers, from what each declares it needs (``Algorithm.needs``).

The task is a 1-D signal classifier written the usual way: a plain LightningModule (cross-entropy in
``training_step``) on ``(N, 1, 40)`` inputs. MixUp mixes any floating input, so it is searched there;
CutMix cuts boxes out of two spatial dimensions, so it is not. What the user names is trained whole
or refused with an error, never trimmed.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from helpers.support import L
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import EMA, CutMix, LabelSmoothing, MixUp
from composer_bridge.core.algorithm import INPUT_KINDS, Algorithm
from composer_bridge.search import Candidate, CandidateWarning, SearchInputError, search_recipe
from composer_bridge.search.candidates import unmet_input_need


class SignalClassifier(L.LightningModule):
    """Three classes of 1-D signals, told apart by the sign of a bump in the middle."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv1d(1, 4, 5, padding=2), torch.nn.ReLU(),
                                       torch.nn.AdaptiveAvgPool1d(4), torch.nn.Flatten(), torch.nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.3, momentum=0.9)


def make_module(total_steps: int) -> SignalClassifier:
    return SignalClassifier()


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(7)
    y = torch.randint(0, 3, (128,), generator=g)
    x = torch.randn(128, 1, 40, generator=g)
    x[:, 0, 15:25] += (y.float() - 1).view(-1, 1)
    return (DataLoader(TensorDataset(x[:96], y[:96]), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(seed)),
            DataLoader(TensorDataset(x[96:], y[96:]), batch_size=32))


KWARGS: dict[str, Any] = dict(monitor="val/acc", run_lengths=[2, 4], search_seeds=[0], confirm_seeds=[10],
                              clock="steps", progress=False, trainer_kwargs={"accelerator": "cpu", "devices": 1})


def test_every_algorithm_declares_only_known_kinds_of_input() -> None:
    from composer_bridge import algorithms

    classes = [getattr(algorithms, n) for n in algorithms.__all__ if isinstance(getattr(algorithms, n), type)]
    declared = {cls.__name__: cls.needs for cls in classes if issubclass(cls, Algorithm) and cls.needs}
    assert all(set(needs) <= set(INPUT_KINDS) for needs in declared.values()), declared
    assert declared["MixUp"] == {"floating input"} and declared["CutMix"] == {"image"}
    # The input-agnostic methods declare nothing: they apply to any input.
    assert not (LabelSmoothing.needs or EMA.needs or algorithms.SAM.needs or algorithms.SWA.needs)


def test_mixup_mixes_a_1d_signal_and_cutmix_says_what_it_needs() -> None:
    signals = (torch.randn(8, 1, 40), torch.zeros(8, dtype=torch.long))
    assert unmet_input_need(MixUp(), signals) is None
    assert "(N, C, H, W)" in unmet_input_need(CutMix(), signals)
    tokens = (torch.randint(0, 50, (8, 40)), torch.zeros(8, dtype=torch.long))
    assert "float" in unmet_input_need(MixUp(), tokens) and "int64" in unmet_input_need(MixUp(), tokens)


def test_mixup_trains_a_plain_module_on_1d_signals() -> None:
    seen: list[torch.Tensor] = []

    class Recording(SignalClassifier):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen.append(batch[0].detach().clone())
            return super().training_step(batch, batch_idx)

    train, _ = make_data(0)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[AlgorithmEngineCallback([MixUp(alpha=1.0)])])
    trainer.fit(Recording(), train)
    originals = [b[0] for b in train]  # the same shuffling generator: the batches the fit drew, unmixed
    assert len(seen) == 3 and all(s.shape == (16, 1, 40) for s in seen)
    assert not any(torch.equal(s, o) for s, o in zip(seen, originals, strict=False))  # the inputs were mixed


def test_the_default_candidates_include_mixup_on_1d_signals_and_leave_out_image_methods() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = search_recipe(make_module, make_data, candidates=None, max_fits=4, **KWARGS, method="greedy")
    searched = result.settings["search_candidates"]
    assert "MixUp" in searched and {"LabelSmoothing", "EMA", "SAM", "GradientClipping"} <= set(searched)
    assert not {"CutMix", "CutOut", "ProgressiveResizing"} & set(searched)
    left_out = " ".join(str(w.message) for w in caught if issubclass(w.category, CandidateWarning))
    assert "CutMix needs a floating-point image batch (N, C, H, W)" in left_out and "MixUp" not in left_out


@pytest.mark.filterwarnings("ignore:EMA's half-life")
def test_mixup_named_explicitly_is_searched_and_confirmed_whole_with_ema() -> None:
    result = search_recipe(make_module, make_data, candidates=["MixUp"], max_fits=8,
                           also_confirm={"mixup-ema": [Candidate("MixUp", name="MixUp"),
                                                       Candidate("EMA", {"half_life": "1ba"})]}, **KWARGS, method="greedy")
    search_configs = {tuple(f.config) for f in result.fits if f.phase == "search"}
    assert ("MixUp",) in search_configs and not any(f.error for f in result.fits)
    # The recipe reported as "mixup-ema" is the one trained: both algorithms, in every confirmation fit of it.
    assert result.settings["also_confirm"] == {"mixup-ema": ["MixUp", "EMA"]}
    assert ("MixUp", "EMA") in {tuple(f.config) for f in result.fits if f.phase == "confirm"}
    assert set(result.also_confirmed) == {"mixup-ema"}


@pytest.mark.parametrize("where", ["candidates", "also_confirm"])
def test_an_explicit_request_that_cannot_apply_is_refused_naming_the_algorithm_why_and_the_fix(where) -> None:
    request = ({"candidates": ["MixUp", "CutMix"]} if where == "candidates"
               else {"candidates": ["MixUp"], "also_confirm": {"mixup-cutmix": ["MixUp", "CutMix"]}})
    with pytest.raises(SearchInputError) as error:
        search_recipe(make_module, make_data, max_fits=8, **{**KWARGS, **request}, method="greedy")
    message = str(error.value)
    assert "['CutMix'] cannot apply" in message and "(N, C, H, W)" in message  # which, and why
    assert "remove CutMix from" in message  # the fix
    assert "MixUp" not in message.split("(")[0]  # MixUp itself is not refused


def test_the_newer_methods_are_default_candidates_offered_where_they_find_something() -> None:
    """Muon, WarmupStableDecay, QKNorm and ZLoss are among the defaults; Muon is offered on a model with a
    hidden nn.Linear and left out, with the reason, where the only Linear is the output layer."""
    from composer_bridge.models.gpt import GPT
    from composer_bridge.search import DEFAULT_CANDIDATES
    from composer_bridge.search.candidates import applicability

    names = [c.algorithm for c in DEFAULT_CANDIDATES]
    assert {"Muon", "WarmupStableDecay", "QKNorm", "ZLoss"} <= set(names)
    muon = next(c for c in DEFAULT_CANDIDATES if c.algorithm == "Muon")
    signal = torch.randn(8, 1, 40), torch.zeros(8, dtype=torch.long)
    reason = applicability(muon, SignalClassifier(), signal, 10)
    assert reason is not None and "no hidden weight matrix in SignalClassifier" in reason
    tokens = torch.randint(0, 16, (2, 8))
    assert applicability(muon, GPT(vocab_size=16, block_size=8, d_model=16, n_layers=1, n_heads=2), (tokens, tokens),
                         10) is None


def test_an_algorithm_whose_targets_are_not_in_the_batch_is_left_out_with_the_fix_before_any_training() -> None:
    """A graph batch is a dict without the tuple's index 1: LabelSmoothing and ZLoss would raise in their first
    step; the check before training says why, and with target_key they apply."""
    from composer_bridge.search.candidates import applicability

    module = torch.nn.Linear(3, 2)
    batch = {"x": torch.randn(5, 3), "edge_index": torch.zeros(2, 4, dtype=torch.long), "y": torch.zeros(2)}
    for name in ("LabelSmoothing", "ZLoss"):
        why = applicability(Candidate(name), module, batch, 10)
        assert why is not None and f"{name} reads the targets at 1" in why and "target_key" in why, why
    assert "reads the targets" not in (applicability(Candidate("LabelSmoothing", {"target_key": "y"}), module, batch, 10)
                                       or "")
