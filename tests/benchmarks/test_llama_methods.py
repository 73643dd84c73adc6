"""benchmarks/llama_methods.py: the newer methods on a Hugging Face Llama written as a plain module, through its dry run."""

from __future__ import annotations

import json
import statistics

import pytest
from helpers.support import load_script

from composer_bridge.search.scoring import strict_speedup

pytest.importorskip("transformers")
llama = load_script("benchmarks/llama_methods.py", "llama_methods_under_test")


def test_the_dry_run_trains_the_plain_llama_with_every_new_method_and_scores_it_like_the_demo(tmp_path) -> None:
    out = tmp_path / "llama"
    data = llama.main(["--dry-run", "--out", str(out)])
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["settings"]["configs"] == ["baseline", "new-all"]
    names = [c["algorithm"] for c in saved["settings"]["algorithms"]["new-all"]]
    assert names == ["Muon", "WarmupStableDecay", "QKNorm", "ZLoss"]
    assert {(r["config"], r["budget"]) for r in saved["runs"]} == {(c, n) for c in ("baseline", "new-all") for n in (2, 4, 8)}
    assert (tmp_path / "llama.png").exists()

    def curve(config: str) -> list[tuple[float, float]]:
        return sorted((r["cpu_s"], r["quality"]) for r in saved["runs"] if r["config"] == config)

    # the speed-up is the shared function's, on the recorded points (lower bits per character is better)
    expected = strict_speedup(curve("baseline"), curve("new-all"), False)[0]
    got = data["results"]["speedups"]["new-all"]["per_seed"][0]
    assert got == expected or (got is None and expected is None)
    assert statistics.mean(r["quality"] for r in saved["runs"]) < 8  # bits per character of a 128-symbol text
