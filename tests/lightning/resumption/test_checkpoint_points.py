"""Exact resumption from every checkpoint point Lightning offers, for every random algorithm (single process).

The oracle is Lightning itself: at each point, plain Lightning (no bridge) resumed with
``fit(ckpt_path=...)`` either ends bit-identical to the uninterrupted run or it does not. Where it
does, every random algorithm must too: weights, optimizer state and the bridge's state
(``torch.equal``). Where it does not (a mid-epoch checkpoint with a loader Lightning cannot
resume), the bridge must add no difference of its own: the resumed run with the bridge listening
to every event (and drawing nothing) ends exactly where plain Lightning's resumed run ends.
docs/checkpoints.md's table is this file's outcome.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.resume_points import POINTS, RANDOM_ALGORITHMS, Point, differences, fit, lightning_api, resume
from helpers.support import LIGHTNING_PACKAGE

#: points where plain Lightning itself does not resume exactly, and why
NOT_EXACT_IN_LIGHTNING = {
    "every_n_train_steps, mid-epoch, plain DataLoader":
        "the loader restarts at the epoch's first batch while the loop continues from the checkpoint's step",
    "OnExceptionCheckpoint after an interruption":
        "the batch in flight when the exception was raised is skipped: the resumable loader had handed it out",
}
#: points where Lightning resumes exactly but the bridge cannot, and warns when the checkpoint is written
WARNED = {
    "trainer.save_checkpoint from on_train_batch_end, callback listed first":
        "the callback saves before the bridge counted the step: the resumed run is one step behind",
}
EXACT = [name for name in POINTS if name not in NOT_EXACT_IN_LIGHTNING and name not in WARNED]
OPEN_STEP = "one step behind"


@pytest.fixture
def api() -> SimpleNamespace:
    """The Lightning package under test (``COMPOSER_BRIDGE_TEST_LIGHTNING``, see tests/helpers/support.py)."""
    return lightning_api(LIGHTNING_PACKAGE)


@pytest.mark.parametrize("point", list(POINTS))
def test_plain_lightning_resumes_exactly_where_the_table_says(point: str, api: SimpleNamespace, tmp_path: Path) -> None:
    full, resumed = resume(api, "plain", POINTS[point], tmp_path)
    if point in NOT_EXACT_IN_LIGHTNING:
        assert differences(full, resumed), f"plain Lightning now resumes {point!r} exactly: update the table"
    else:
        assert differences(full, resumed) == []


@pytest.mark.parametrize("point", list(POINTS))
def test_the_bridge_adds_no_difference_of_its_own(point: str, api: SimpleNamespace, tmp_path: Path) -> None:
    """The bridge hearing every event and drawing nothing resumes to exactly where plain Lightning resumes to."""
    plain = resume(api, "plain", POINTS[point], tmp_path / "plain")[1]
    listening = resume(api, "listen", POINTS[point], tmp_path / "listen")[1]
    listening.bridge = None
    assert differences(plain, listening) == []


@pytest.mark.parametrize("algorithm", ["listen", *RANDOM_ALGORITHMS])
@pytest.mark.parametrize("point", EXACT)
def test_every_random_algorithm_resumes_exactly(point: str, algorithm: str, api: SimpleNamespace, tmp_path: Path) -> None:
    """Weights, optimizer state and the bridge's state (timestamp, every algorithm's state) all bit-identical."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        full, resumed = resume(api, algorithm, POINTS[point], tmp_path)
    assert not [w for w in caught if OPEN_STEP in str(w.message)]
    assert differences(full, resumed) == []


@pytest.mark.parametrize("point", list(WARNED))
def test_a_checkpoint_written_before_the_bridge_counted_the_step_warns(point: str, api: SimpleNamespace,
                                                                      tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=OPEN_STEP):
        full, resumed = resume(api, "CutOut", POINTS[point], tmp_path)
    assert "bridge.timestamp.batch: 9 != 8" in differences(full, resumed)


def test_save_on_train_epoch_end_false_without_validation_writes_no_checkpoint(api: SimpleNamespace,
                                                                               tmp_path: Path) -> None:
    """The table's note: with no validation loop, ``on_validation_end`` never runs, so this setting saves nothing."""
    point = Point("every_n_epochs, no validation, save_on_train_epoch_end=False",
                  lambda api, h, d: [api.ModelCheckpoint(dirpath=d, every_n_epochs=1, save_on_train_epoch_end=False)],
                  "none")
    fit(api, "CutOut", point, tmp_path, write=True)
    assert not list(tmp_path.glob("*.ckpt"))
