"""benchmarks/plain_loss_overhead.py compares equal work: its plain and ComposerModule arms train the same weights."""

from __future__ import annotations

import torch
from helpers.support import load_script


def test_the_plain_and_composer_arms_train_identical_weights() -> None:
    bench = load_script("benchmarks/plain_loss_overhead.py", "plain_loss_overhead_under_test")
    *_, composer = bench.run_arm("composer", steps=3, warmup=0)
    decile, mean, plain = bench.run_arm("plain", steps=3, warmup=0)
    assert 0 < decile <= mean
    for (name, got), want in zip(plain.net.state_dict().items(), composer.module.state_dict().values(), strict=True):
        assert torch.equal(got, want), name
