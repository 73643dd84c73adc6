"""composer_bridge.search.proxy: what a proxy search trains instead of the full-size run, and how it is named."""

from __future__ import annotations

import functools

import pytest

from composer_bridge.search.proxy import Proxy


def _make_module(scale: float = 1.0) -> None:
    return None


def test_shorter_keeps_each_length_s_fraction_distinct_and_at_least_one_step() -> None:
    assert Proxy.shorter([200, 400, 800], 0.25).run_lengths == (50, 100, 200)
    # lengths that round to the same step count once; none goes below one step
    assert Proxy.shorter([1, 2, 3, 4], 0.25).run_lengths == (1,)
    assert Proxy.shorter([10, 20], 1.0).run_lengths == (10, 20)


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5, float("nan")])
def test_shorter_refuses_a_fraction_outside_zero_to_one_naming_it(fraction: float) -> None:
    with pytest.raises(ValueError, match=r"fraction=.*expected a number in \(0, 1\]"):
        Proxy.shorter([100], fraction)


def test_describe_names_the_lengths_and_the_cheaper_factories_with_their_arguments() -> None:
    assert Proxy().describe() == "as at full size"
    proxy = Proxy(run_lengths=(5, 10), make_module=functools.partial(_make_module, scale=0.25))
    assert proxy.describe() == f"run lengths [5, 10], make_module={__name__}._make_module(scale=0.25)"
