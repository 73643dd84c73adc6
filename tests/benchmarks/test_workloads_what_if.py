"""benchmarks/workloads_what_if.py: the search's score with another configuration handed over on some workloads."""

from __future__ import annotations

import json
import math

import pytest
from helpers.support import load_script

what_if_script = load_script("benchmarks/workloads_what_if.py", "workloads_what_if_under_test")


def _row(seconds: list[float | None]) -> dict:
    finite = sorted(math.inf if s is None else s for s in seconds)
    return {"median_seconds": finite[len(finite) // 2],
            "seeds": {str(i): {"seconds": s} for i, s in enumerate(seconds)}}


def _results() -> dict:
    # "hard": the baseline and the search miss the target on 2 of 3 seeds, EMA reaches it on all three;
    # "easy": the search's pick is slower than the baseline, EMA faster
    return {"workloads": {
        "hard": {"configs": {"baseline": _row([4.0, None, None]), "EMA": _row([3.0, 3.2, 3.4]),
                             "search": _row([4.0, None, None])}, "not_applicable": []},
        "easy": {"configs": {"baseline": _row([2.0, 2.1, 2.2]), "EMA": _row([1.8, 1.9, 2.0]),
                             "search": _row([3.0, 3.1, 3.2])}, "not_applicable": []}}}


def test_handing_over_a_configuration_scores_the_search_on_that_configurations_own_held_out_times() -> None:
    results = _results()
    as_measured = what_if_script.what_if(results, {}, replicates=200)["scores"]
    handed = what_if_script.what_if(results, {"hard": "EMA"}, replicates=200)
    # unchanged: the search fails "hard" and is 3.1 / 1.9 on "easy"
    assert as_measured["search"]["score"] == pytest.approx((0 + (4 - 3.1 / 1.9) / 3) / 2, abs=1e-6)
    # EMA's times on "hard": the fastest there, so ratio 1; "easy" is still the search's own pick
    assert handed["scores"]["search"]["score"] == pytest.approx((1 + (4 - 3.1 / 1.9) / 3) / 2, abs=1e-6)
    assert handed["scores"]["EMA"] == as_measured["EMA"]  # the others' ratios are to the fastest: EMA's own here
    rest = what_if_script.what_if(results, {"hard": "EMA"}, rest="baseline", replicates=200)["scores"]
    assert rest["search"]["score"] == pytest.approx((1 + (4 - 2.1 / 1.9) / 3) / 2, abs=1e-6)
    # the search, now EMA's on both workloads, ties EMA in every draw
    assert what_if_script.what_if(results, {"hard": "EMA"}, rest="EMA", replicates=200)["search_above"]["EMA"] == 0.5
    assert results == _results()  # the results read are not changed


def test_a_workload_or_configuration_that_is_not_there_is_named_with_what_is(tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match=r"workload 'vit' is not scored here; expected one of \['easy', 'hard'\]"):
        what_if_script.what_if(_results(), {"vit": "EMA"})
    with pytest.raises(ValueError, match=r"'Muon' has no held-out times on 'hard'; expected one of \['EMA'"):
        what_if_script.what_if(_results(), {"hard": "Muon"})
    with pytest.raises(ValueError, match=r"--rest 'SAM' is not a configuration here"):
        what_if_script.what_if(_results(), {}, rest="SAM")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results()))
    with pytest.raises(SystemExit):
        what_if_script.main([str(path), "--hand", "hard:EMA"])
    assert "expected WORKLOAD=CONFIG" in capsys.readouterr().err
    out = what_if_script.main([str(path), "--hand", "hard=EMA"])
    assert out["scores"]["search"]["score"] > 0.5 and "search" in capsys.readouterr().out


def test_the_docstring_example_runs() -> None:
    import doctest

    assert doctest.testmod(what_if_script).failed == 0
