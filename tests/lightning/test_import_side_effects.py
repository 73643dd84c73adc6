"""Importing composer_bridge leaves Lightning's logging and deprecation warnings where they were.

``lightning.pytorch`` and ``pytorch_lightning`` share two settings of ``lightning_utilities``: the
logger their rank-zero messages go to ("GPU available: ...", "`Trainer.fit` stopped: ...") and the
class of their deprecation warnings; each package sets them to its own when imported. The bridge
imports both (its callback is a Callback of each), so without care the package imported second
would take over: ``logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)``, Lightning's
documented way to quiet it, would stop working, and so would filters on its
``LightningDeprecationWarning``. Each case runs in a fresh interpreter: only the first import counts.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers.support import REPO

SCRIPT = """
import logging, warnings
{imports}
logging.getLogger("{logger}").setLevel(logging.ERROR)  # the user quiets Lightning's info messages
{package}.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False)
import {rank_zero} as rank_zero
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rank_zero.rank_zero_deprecation("deprecated!")
assert [w.category for w in caught] == [rank_zero.LightningDeprecationWarning], [w.category for w in caught]
print("done")
"""

CASES = {
    # (imports in the user's order, the package the user trains with)
    "lightning, then the bridge": (["import lightning as L", "from composer_bridge import AlgorithmEngineCallback"], "L"),
    "the bridge, then lightning": (["from composer_bridge import AlgorithmEngineCallback", "import lightning as L"], "L"),
    "pytorch_lightning, then the bridge": (
        ["import pytorch_lightning as pl", "from composer_bridge import AlgorithmEngineCallback"], "pl"),
    "the bridge's pl flavour, then pytorch_lightning": (
        ["from composer_bridge.pl import AlgorithmEngineCallback", "import pytorch_lightning as pl"], "pl"),
    "pytorch_lightning, then the bridge's pl flavour": (
        ["import pytorch_lightning as pl", "from composer_bridge.pl import ComposerClassifier"], "pl"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_lightnings_messages_and_deprecations_stay_with_the_users_package(case: str) -> None:
    imports, package = CASES[case]
    logger, rank_zero = {
        "L": ("lightning.pytorch", "lightning.pytorch.utilities.rank_zero"),
        "pl": ("pytorch_lightning", "pytorch_lightning.utilities.rank_zero"),
    }[package]
    script = textwrap.dedent(SCRIPT).format(imports="\n".join(imports), logger=logger, package=package, rank_zero=rank_zero)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "done"
    assert "GPU available" not in result.stderr  # quieted, as without the bridge
