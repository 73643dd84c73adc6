"""Everything that needs a CUDA GPU, in one command: the GPU tests and the GPU measurements.

Runs, one after the other, each in its own process with a time limit (9 minutes in all on one H100
is the aim; the limits below add up to 8.5):

1. ``tests/gpu`` (every algorithm in bf16-mixed, exact resumption, fp16 AMP, channels-last, device
   randomness and syncs; benchmarks/pareto.py's large set-up on the device), with a JUnit report;
2. ``tests/algorithms/test_weights_functional.py`` (its fp16 AMP case runs on a GPU only);
3. ``benchmarks/gpu_checks.py`` (step times by precision and memory format, the batch algorithms'
   GPU time, the bridge's overhead), whose JSON holds the numbers docs/gpu-tpu.md and
   docs/benchmarks.md quote.

It prints each step's outcome and time and the measured tables, and writes to ``--out`` (default
``gpu_campaign/``): ``campaign.json`` (machine, versions, commit, date, each step's result and
time, and gpu_checks' numbers), ``gpu_checks.json``, a JUnit XML and a log per step. It exits with 1
when a step failed or ran past its limit, and with 2, before running anything, when torch sees
no CUDA GPU.

Usage (from the repository root, in the project's venv with a CUDA build of torch)::

    python benchmarks/gpu_campaign.py --out gpu_campaign
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def steps(out: Path) -> list[dict[str, Any]]:
    """The campaign: name, command and time limit (seconds) of each step."""
    python = sys.executable
    return [
        {"name": "tests/gpu", "limit": 270,
         "argv": [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu", f"--junitxml={out / 'tests_gpu.xml'}"]},
        {"name": "fp16 AMP weights test", "limit": 60,
         "argv": [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/algorithms/test_weights_functional.py",
                  f"--junitxml={out / 'tests_weights.xml'}"]},
        {"name": "benchmarks/gpu_checks.py", "limit": 180,
         "argv": [python, "benchmarks/gpu_checks.py", "--out", str(out / "gpu_checks.json")]},
    ]


def no_gpu_reason() -> str | None:
    """Why the campaign cannot run here (``None`` when torch sees a CUDA GPU)."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"torch {torch.__version__}" + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (a CPU-only build)")
    return (f"gpu_campaign: no CUDA GPU: {build} sees none (torch.cuda.is_available() is False). Nothing was run. "
            "Fix: run it on a machine with an NVIDIA GPU, in a venv with a CUDA build of torch.")


def pytest_counts(output: str) -> str:
    """pytest's final count line ("12 passed, 1 skipped in 40.1s"), or '' when there is none."""
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed|error|skipped).*?)\s*=*$", output, re.MULTILINE)
    return found[-1] if found else ""


def run_step(step: dict[str, Any], out: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               PYTHONUNBUFFERED="1")  # a step stopped at its limit still leaves what it printed
    # the CPU dry run works through the same configurations far more slowly: its limits are 5x
    limit = step["limit"] * (5 if os.environ.get("COMPOSER_BRIDGE_GPU_DRY_RUN") == "1" else 1)
    started = time.perf_counter()
    try:
        done = subprocess.run(step["argv"], cwd=REPO, env=env, capture_output=True, text=True, timeout=limit)
        output, code, timed_out = done.stdout + done.stderr, done.returncode, False
    except subprocess.TimeoutExpired as expired:
        partial = expired.stdout or ""
        output = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        code, timed_out = None, True
    seconds = time.perf_counter() - started
    log = out / (re.sub(r"[^A-Za-z0-9]+", "_", step["name"]).strip("_") + ".log")
    log.write_text(output)
    return {"name": step["name"], "command": " ".join(map(str, step["argv"])), "limit_s": limit,
            "seconds": round(seconds, 1), "exit_code": code, "timed_out": timed_out,
            "ok": code == 0 and not timed_out, "pytest": pytest_counts(output), "log": log.name}


def machine() -> dict[str, Any]:
    import lightning
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (dry run on the CPU)"
    return {"gpu": gpu, "gpus": torch.cuda.device_count(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "lightning": lightning.__version__,
            "commit": commit or None, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu_campaign"), help="folder for the results (default gpu_campaign/)")
    parser.add_argument("--dry-run", action="store_true",
                        help="run every step on the CPU at toy sizes (COMPOSER_BRIDGE_GPU_DRY_RUN=1): checks the "
                             "campaign itself; its numbers mean nothing")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["COMPOSER_BRIDGE_GPU_DRY_RUN"] = "1"
    reason = None if args.dry_run else no_gpu_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine": machine(), "steps": []}
    print(f"GPU campaign on {report['machine']['gpu']}, torch {report['machine']['torch']}, commit {report['machine']['commit']}")
    for step in steps(out):
        result = run_step(step, out)
        report["steps"].append(result)
        status = "ok" if result["ok"] else ("TIMED OUT" if result["timed_out"] else f"FAILED (exit {result['exit_code']})")
        print(f"  {result['name']:<28} {status:<18} {result['seconds']:7.1f} s  {result['pytest']}")
    checks = out / "gpu_checks.json"
    if checks.exists():
        report["gpu_checks"] = json.loads(checks.read_text())
        print((out / "benchmarks_gpu_checks_py.log").read_text()[-6000:])  # its tables, as it printed them
    report["total_seconds"] = round(sum(s["seconds"] for s in report["steps"]), 1)
    (out / "campaign.json").write_text(json.dumps(report, indent=2))
    failed = [s["name"] for s in report["steps"] if not s["ok"]]
    print(f"{report['total_seconds']:.0f} s in all; results in {out / 'campaign.json'}"
          + (f"; FAILED: {', '.join(failed)} (see the logs there)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
