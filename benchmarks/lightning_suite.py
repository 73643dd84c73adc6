"""Lightning's own test suite as an oracle: does adding the bridge change any test's outcome?

Lightning's published packages carry no tests, so this script is given a checkout of Lightning's
source (``tests/tests_pytorch`` inside it) at the installed version. It runs a slice of those
tests up to three times, in separate pytest processes, and compares the outcomes test by test:

* ``plain``: as is;
* ``idle``: ``AlgorithmEngineCallback([])`` appended to the callbacks of every ``Trainer`` the
  tests build (``lightning.pytorch`` and ``pytorch_lightning`` alike);
* ``listening``: ``AlgorithmEngineCallback(callbacks=[RecordEvents()])``, an engine callback that
  records every event and changes nothing, so every per-step hook of the bridge is live.

The injection is a pytest plugin the script writes to a temporary folder: it wraps
``Trainer.__init__`` so that the bridge goes in through the ``callbacks`` argument, as a user would
put it. Nothing of Lightning's is copied into this repository. Tests whose outcome differs for a
reason that is an artefact of the injection (not a change a user would see) are listed in
:data:`KNOWN_ARTEFACTS` with the reason; every other difference is reported as unexplained and
makes the script exit with status 1.

Example (the numbers in docs/reliability.md came from this; the default slice, 2,231 tests, takes
about 30 minutes a mode on one core of a 2-core machine, so two modes side by side take about as long)::

    git clone --branch 2.6.6 --depth 1 https://github.com/Lightning-AI/pytorch-lightning /tmp/lightning
    python benchmarks/lightning_suite.py /tmp/lightning --out /tmp/lightning-suite
    python benchmarks/lightning_suite.py /tmp/lightning --only trainer/test_trainer.py --modes plain idle

``--recheck`` runs the tests that differ once more in every mode and counts only the differences
that repeat (Lightning has a few timing-dependent tests). ``--reuse`` keeps the junit files of
modes already run in ``--out``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

#: the folders of ``tests/tests_pytorch`` run by default
DEFAULT_SLICE = ("trainer", "loops", "callbacks", "checkpointing", "loggers", "core", "models")

#: files that cannot run without downloads or packages Lightning's test requirements add
IGNORED = (
    "checkpointing/test_legacy_checkpoints.py",  # needs Lightning's legacy checkpoints, downloaded by its CI
    "models/test_onnx.py",  # needs onnx
)

MODES = ("plain", "idle", "listening")

#: test-id patterns (fnmatch on ``file::name``) whose outcome the injection changes by itself, with
#: the modes it does so in and the reason. An entry here must never hide a change a user would see.
_CALLBACK_LIST = "asserts the exact trainer.callbacks list; the injected bridge is one more entry in it"
KNOWN_ARTEFACTS: dict[str, tuple[tuple[str, ...], str]] = {
    "trainer/connectors/test_callback_connector.py::test_attach_model_callbacks": (("idle", "listening"), _CALLBACK_LIST),
    "trainer/connectors/test_callback_connector.py::test_checkpoint_callbacks_are_last": (
        ("idle", "listening"), _CALLBACK_LIST,
    ),
    "trainer/connectors/test_callback_connector.py::test_configure_external_callbacks": (
        ("idle", "listening"), _CALLBACK_LIST,
    ),
    "callbacks/test_throughput_monitor.py::test_throughput_monitor_*": (
        ("listening",),
        "patches the global time.perf_counter with a fixed list of values; a listening bridge reads the "
        "clock once per optimizer step for state.timestamp's wall-clock and so takes some of them "
        "(with a real clock nothing changes; an idle bridge reads none)",
    ),
}  # fmt: skip

#: tests that fail as is, for a reason of Lightning's or torch's, and pass with the bridge (a change a user
#: sees, but not a harm): reported apart, with the reason, as long as the change is failed -> passed.
KNOWN_FIXED_BY_THE_BRIDGE: dict[str, tuple[tuple[str, ...], str]] = {
    "utilities/test_compile.py::test_trainer_compiled_model_that_logs": (
        ("listening",),
        "fails as is on torch 2.13: in a torch.compile'd module, LightningModule.log inspects the "
        "training_step bound method (inspect.getfullargspec), which dynamo cannot trace; a listening "
        "bridge's training_step is a plain function on the instance, which it traces",
    ),
}

PLUGIN = '''
"""Written by composer_bridge's benchmarks/lightning_suite.py: appends the bridge to every Trainer."""
import functools
import os

import pytest

MODE = os.environ["COMPOSER_BRIDGE_SUITE_MODE"]


def pytest_configure(config):
    # pytest-rerunfailures is not part of this run: its marker must still be known (--strict-markers)
    config.addinivalue_line("markers", "flaky(reruns, reruns_delay): rerun a flaky test (inert here)")
    if MODE != "plain":
        _inject()


def _bridge():
    from composer_bridge import AlgorithmEngineCallback

    if MODE == "idle":
        return AlgorithmEngineCallback([])
    return AlgorithmEngineCallback([], callbacks=[RecordEvents()])


def _record_events_class():
    from composer_bridge import Callback

    class RecordEvents(Callback):
        """Records every event and changes nothing (module-level: ddp_spawn pickles the Trainer's callbacks)."""

        def __init__(self):
            self.events = []

        def run_event(self, event, state, logger):
            self.events.append(event)

    RecordEvents.__module__ = __name__
    RecordEvents.__qualname__ = "RecordEvents"
    return RecordEvents


if MODE == "listening":
    RecordEvents = _record_events_class()


def _inject():
    import importlib
    import sys

    # tests_pytorch uses lightning.pytorch; pytorch_lightning is patched too where something imported
    # it (composer_bridge imports both, and keeps Lightning's rank-zero log with lightning.pytorch,
    # the package imported first).
    for package in ("lightning.pytorch", "pytorch_lightning"):
        if package == "pytorch_lightning" and package not in sys.modules:
            continue
        trainer_cls = importlib.import_module(package).Trainer
        original = trainer_cls.__init__

        @functools.wraps(original)
        def __init__(self, *args, __original=original, **kwargs):
            callbacks = kwargs.get("callbacks")
            if callbacks is None:
                callbacks = []
            elif not isinstance(callbacks, (list, tuple)):
                callbacks = [callbacks]
            kwargs["callbacks"] = [*callbacks, _bridge()]
            __original(self, *args, **kwargs)

        trainer_cls.__init__ = __init__
'''


def _run_mode(mode: str, src: Path, tests: list[str], junit: Path, plugin_dir: Path, args: argparse.Namespace) -> int:
    env = dict(os.environ)
    repo_root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_dir), str(src / "tests"), str(repo_root), env.get("PYTHONPATH", "")])
    env["COMPOSER_BRIDGE_SUITE_MODE"] = mode
    env.setdefault("WANDB_MODE", "offline")
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_bridge_suite_plugin",
        "--continue-on-collection-errors", f"--junitxml={junit}", f"--timeout={args.timeout}",
        "-o", "junit_family=xunit2", "--color=no",
        *[f"--ignore=tests_pytorch/{path}" for path in IGNORED],
    ]  # fmt: skip
    if args.k:
        cmd += ["-k", args.k]
    if args.xdist:
        cmd += ["-p", "xdist", "-n", str(args.xdist)]
    cmd += tests
    print(f"[{mode}] {' '.join(cmd)}", flush=True)
    log = junit.with_suffix(".log")
    with open(log, "w") as out:
        process = subprocess.Popen(cmd, cwd=src / "tests", env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            return process.wait(timeout=args.budget_minutes * 60 if args.budget_minutes else None)
        except subprocess.TimeoutExpired:
            print(f"[{mode}] budget of {args.budget_minutes} min spent: interrupting", flush=True)
            return _interrupt(process, junit)


def _interrupt(process: subprocess.Popen[bytes], junit: Path) -> int:
    """Stop pytest so that it still writes the junit file of the tests that finished.

    pytest stops at a KeyboardInterrupt, but one that lands inside a ``Trainer`` is Lightning's:
    it ends that ``fit`` (the test fails with ``SystemExit``) and pytest goes on to the next test.
    So interrupt again until pytest itself stops; the tests failed that way are marked in
    ``<junit>.interrupted`` and count as not reached.
    """
    for _ in range(10):
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        process.kill()
        code = process.wait()
    junit.with_suffix(".interrupted").write_text("")
    return code


def outcomes(junit: Path) -> dict[str, str]:
    """``{test id: outcome}`` from a junit file; outcome is passed/failed/error/skipped.

    In a run stopped by ``--budget-minutes`` the tests that the interrupt itself failed are left
    out (not reached), since they say nothing about the bridge.
    """
    interrupted = junit.with_suffix(".interrupted").exists()
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        # classname is "[tests.]tests_pytorch.trainer.test_x[.TestClass]": the id is "trainer/test_x.py::[TestClass::]name"
        parts = case.get("classname", "").split(".")
        if "tests_pytorch" in parts:
            parts = parts[parts.index("tests_pytorch") + 1 :]
        split = max((i for i, part in enumerate(parts) if part.startswith("test_")), default=len(parts) - 1) + 1
        file = "/".join(parts[:split]) + ".py::" + "::".join([*parts[split:], case.get("name", "")])
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                if child.tag == "skipped" and "xfail" in (child.get("type", "") + child.get("message", "")):
                    outcome = "xfailed"
                if interrupted and child.tag in ("failure", "error") and _by_interrupt(child):
                    outcome = "interrupted"
                break
        if outcome == "interrupted":
            continue
        if outcome == "error" and result.get(file) == "passed":
            outcome = "error in teardown"
        result[file] = outcome
    return result


def _by_interrupt(element: ET.Element) -> bool:
    text = (element.get("message") or "") + (element.text or "")
    return "KeyboardInterrupt" in text or "SystemExit" in text


def artefact_reason(test_id: str, mode: str) -> str | None:
    return _reason(KNOWN_ARTEFACTS, test_id, mode)


def _reason(table: dict[str, tuple[tuple[str, ...], str]], test_id: str, mode: str) -> str | None:
    for pattern, (modes, reason) in table.items():
        if mode in modes and fnmatch.fnmatch(test_id, pattern):
            return reason
    return None


def compare(base: dict[str, str], other: dict[str, str], mode: str) -> dict[str, list[str]]:
    report: dict[str, list[str]] = {"same": [], "artefact": [], "fixed_by_the_bridge": [], "different": [],
                                    "not_reached": []}
    for test_id, outcome in sorted(base.items()):
        if test_id not in other:  # an interrupted run (--budget-minutes) did not get there
            report["not_reached"].append(test_id)
        elif other[test_id] == outcome:
            report["same"].append(test_id)
        elif artefact_reason(test_id, mode):
            report["artefact"].append(test_id)
        elif (outcome, other[test_id]) == ("failed", "passed") and _reason(KNOWN_FIXED_BY_THE_BRIDGE, test_id, mode):
            report["fixed_by_the_bridge"].append(test_id)
        else:
            report["different"].append(test_id)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lightning_src", type=Path, help="a checkout of Lightning's source (holds tests/tests_pytorch)")
    parser.add_argument("--slice", nargs="+", default=list(DEFAULT_SLICE), help="folders of tests/tests_pytorch")
    parser.add_argument("--only", nargs="+", help="paths under tests/tests_pytorch instead of --slice")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument("--out", type=Path, default=None, help="folder for junit files and logs (default: a temp folder)")
    parser.add_argument("--timeout", type=int, default=300, help="per-test timeout in seconds (pytest-timeout)")
    parser.add_argument("--xdist", type=int, default=0, help="pytest-xdist workers (only if installed)")
    parser.add_argument("--reuse", action="store_true", help="keep junit files of modes already run in --out")
    parser.add_argument(
        "--budget-minutes", type=float, default=0,
        help="interrupt each run after this long; the comparison covers the tests every mode finished",
    )
    parser.add_argument("--run-only", action="store_true", help="run the modes, compare nothing (to run modes side by side)")
    parser.add_argument("--recheck", action="store_true", help="rerun differing tests in every mode; keep stable ones")
    args = parser.parse_args(argv)

    src = args.lightning_src.resolve()
    if not (src / "tests" / "tests_pytorch").is_dir():
        parser.error(f"{src} holds no tests/tests_pytorch: give the root of a Lightning source checkout")
    import lightning

    version_file = src / "src" / "version.info"
    checkout_version = version_file.read_text().strip() if version_file.exists() else "unknown"
    print(f"installed lightning {lightning.__version__}; checkout {checkout_version}", flush=True)
    if "plain" not in args.modes and not args.run_only:
        parser.error("--modes must include plain: it is the reference (or give --run-only)")

    out = args.out or Path(tempfile.mkdtemp(prefix="lightning-suite-"))
    out.mkdir(parents=True, exist_ok=True)
    plugin_dir = out / "plugin"
    plugin_dir.mkdir(exist_ok=True)
    (plugin_dir / "_bridge_suite_plugin.py").write_text(textwrap.dedent(PLUGIN))
    tests = [f"tests_pytorch/{p}" for p in (args.only or args.slice)]

    results: dict[str, dict[str, str]] = {}
    for mode in args.modes:
        junit = out / f"{mode}.xml"
        if not (args.reuse and junit.exists()):
            junit.with_suffix(".interrupted").unlink(missing_ok=True)
            _run_mode(mode, src, tests, junit, plugin_dir, args)
        results[mode] = outcomes(junit)
    if args.run_only:
        print(json.dumps({mode: _count(result.values()) for mode, result in results.items()}))
        return 0

    base = results["plain"]
    reports = {mode: compare(base, results[mode], mode) for mode in args.modes if mode != "plain"}
    if args.recheck:
        flaky = sorted({t for r in reports.values() for t in r["different"]})
        if flaky:
            ids = [f"tests_pytorch/{t}" for t in flaky]
            again: dict[str, dict[str, str]] = {}
            for mode in args.modes:
                junit = out / f"{mode}-recheck.xml"
                _run_mode(mode, src, ids, junit, plugin_dir, argparse.Namespace(**{**vars(args), "k": None}))
                again[mode] = outcomes(junit)
            for mode, report in reports.items():
                stable = []
                for t in report["different"]:
                    # a difference counts if it repeats: the rerun differs from the rerun reference too
                    if again[mode].get(t) != again["plain"].get(t) or again["plain"].get(t) != base.get(t):
                        stable.append(t)
                    else:
                        report["same"].append(t)
                report["different"] = stable

    summary = {
        "lightning_installed": lightning.__version__,
        "lightning_checkout": checkout_version,
        "tests": tests,
        "tests_run": len(base),
        "finished_in_every_mode": len(set(base).intersection(*results.values())),
        "plain_outcomes": _count(base.values()),
    }
    status = 0
    for mode, report in reports.items():
        summary[mode] = {key: len(value) for key, value in report.items()}
        summary[f"{mode}_by_folder"] = _by_folder(report)
        print(f"\n== {mode}: same {len(report['same'])}, artefacts {len(report['artefact'])}, "
              f"fixed by the bridge {len(report['fixed_by_the_bridge'])}, "
              f"different {len(report['different'])}, not reached {len(report['not_reached'])}")  # fmt: skip
        for test_id in report["artefact"]:
            print(f"  artefact  {test_id}: {base[test_id]} -> {results[mode].get(test_id)} ({artefact_reason(test_id, mode)})")
        for test_id in report["fixed_by_the_bridge"]:
            print(f"  fixed     {test_id}: failed -> passed ({_reason(KNOWN_FIXED_BY_THE_BRIDGE, test_id, mode)})")
        for test_id in report["different"]:
            print(f"  DIFFERENT {test_id}: {base[test_id]} -> {results[mode][test_id]}")
            status = 1
    print(json.dumps(summary, indent=1))
    (out / "summary.json").write_text(json.dumps({**summary, "reports": reports}, indent=1))
    print(f"\njunit files, logs and summary.json in {out}")
    return status


def _by_folder(report: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    """``{folder: {same: n, artefact: n, ...}}``: a report's counts per folder of ``tests_pytorch``."""
    folders: dict[str, dict[str, int]] = {}
    for key, test_ids in report.items():
        for test_id in test_ids:
            counts = folders.setdefault(test_id.split("/", 1)[0], {})
            counts[key] = counts.get(key, 0) + 1
    return folders


def _count(values: object) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:  # type: ignore[attr-defined]
        counts[value] = counts.get(value, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
