"""The comparison logic of benchmarks/lightning_suite.py (the runs themselves need Lightning's source checkout)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from helpers.support import REPO

_spec = importlib.util.spec_from_file_location("lightning_suite", REPO / "benchmarks" / "lightning_suite.py")
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)  # type: ignore[union-attr]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests_pytorch.trainer.test_a" name="test_passes"/>
<testcase classname="tests_pytorch.trainer.test_a.TestGroup" name="test_in_class[1]"/>
<testcase classname="tests_pytorch.loops.test_b" name="test_fails"><failure message="AssertionError">x</failure></testcase>
<testcase classname="tests_pytorch.loops.test_b" name="test_skipped"><skipped message="needs a GPU"/></testcase>
<testcase classname="tests_pytorch.loops.test_b" name="test_xfails"><skipped type="pytest.xfail" message="xfail"/></testcase>
<testcase classname="tests_pytorch.loops.test_b" name="test_interrupted"><failure message="SystemExit: 1">SystemExit</failure></testcase>
</testsuite></testsuites>
"""


def test_outcomes_are_read_per_test_id(tmp_path: Path) -> None:
    junit = tmp_path / "plain.xml"
    junit.write_text(JUNIT)
    assert suite.outcomes(junit) == {
        "trainer/test_a.py::test_passes": "passed",
        "trainer/test_a.py::TestGroup::test_in_class[1]": "passed",
        "loops/test_b.py::test_fails": "failed",
        "loops/test_b.py::test_skipped": "skipped",
        "loops/test_b.py::test_xfails": "xfailed",
        "loops/test_b.py::test_interrupted": "failed",
    }
    # a run stopped by --budget-minutes: the tests its interrupt failed count as not reached
    junit.with_suffix(".interrupted").write_text("")
    assert "loops/test_b.py::test_interrupted" not in suite.outcomes(junit)
    assert suite.outcomes(junit)["loops/test_b.py::test_fails"] == "failed"


def test_differences_artefacts_and_fixes_are_told_apart() -> None:
    artefact = "trainer/connectors/test_callback_connector.py::test_attach_model_callbacks"
    fixed = "utilities/test_compile.py::test_trainer_compiled_model_that_logs"
    base = {"a.py::same": "passed", "a.py::broken": "passed", artefact: "passed", fixed: "failed", "a.py::gone": "passed"}
    other = {"a.py::same": "passed", "a.py::broken": "failed", artefact: "failed", fixed: "passed"}
    report = suite.compare(base, other, "listening")
    assert report == {"same": ["a.py::same"], "artefact": [artefact], "fixed_by_the_bridge": [fixed],
                      "different": ["a.py::broken"], "not_reached": ["a.py::gone"]}
    # a listed artefact or fix counts only in its modes, and a fix only as failed -> passed
    assert suite.compare({fixed: "failed"}, {fixed: "passed"}, "idle")["different"] == [fixed]
    assert suite.compare({fixed: "passed"}, {fixed: "failed"}, "listening")["different"] == [fixed]
