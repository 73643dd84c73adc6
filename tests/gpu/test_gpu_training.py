"""On a CUDA GPU: every algorithm in bf16-mixed, exact resumption, fp16 AMP, channels-last, device randomness, syncs.

Skipped without CUDA (CI has none). ``COMPOSER_BRIDGE_GPU_DRY_RUN=1`` runs them on the CPU instead,
skipping only what exists on CUDA alone (``16-mixed`` with its gradient scaler, the sync-debug mode),
so that every other line can be exercised on a machine without a GPU.

Determinism: the exact-resumption tests turn on ``torch.use_deterministic_algorithms(True,
warn_only=True)`` for their duration, and ``tests/gpu/conftest.py`` sets
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` at collection (before cuBLAS starts). ``warn_only`` because a
few backward kernels (adaptive average pooling, for one) have no deterministic CUDA version and
would raise otherwise; they add with atomics, so the comparison allows a 1e-6 relative tolerance.
The whole resumption matrix also runs on a GPU with ``COMPOSER_BRIDGE_TEST_ACCELERATOR=gpu``.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers.support import REPO, image_loader, quiet_trainer, tiny_classifier, weights_of

import composer_bridge.algorithms as library
import composer_bridge.functional as F
from composer_bridge import AlgorithmEngineCallback, Event, Logger, State, Timestamp
from composer_bridge.algorithms import SAM, ChannelsLast, GradientClipping

CUDA = torch.cuda.is_available()
DRY_RUN = os.environ.get("COMPOSER_BRIDGE_GPU_DRY_RUN") == "1"
DEVICE = "cuda" if CUDA else "cpu"
ACCELERATOR = "gpu" if CUDA else "cpu"

pytestmark = pytest.mark.skipif(
    not (CUDA or DRY_RUN), reason="needs a CUDA GPU (COMPOSER_BRIDGE_GPU_DRY_RUN=1 runs these on the CPU)"
)
cuda_only = pytest.mark.skipif(not CUDA, reason="exists on CUDA only (dry run on the CPU)")


def _load_matrix() -> Any:
    """The resumption matrix's model/data choices per algorithm (tests/lightning/resumption/test_every_algorithm.py)."""
    path = REPO / "tests" / "lightning" / "resumption" / "test_every_algorithm.py"
    spec = importlib.util.spec_from_file_location("_gpu_resumption_matrix_cases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MATRIX = _load_matrix()


def gpu_trainer(**overrides: Any) -> L.Trainer:
    return quiet_trainer(accelerator=ACCELERATOR, devices=1, **overrides)


@pytest.fixture
def deterministic() -> Iterator[None]:
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark


def fit_case(name: str, ckpt: Path | None = None, save_dir: Path | None = None) -> tuple[torch.nn.Module, Any]:
    """Train the matrix's case for ``name`` 3 epochs x 3 steps in bf16-mixed; checkpoint every epoch into ``save_dir``."""
    factory, (model_factory, loader_factory) = MATRIX.case(name)
    assert factory is not None, f"{name} needs an entry in the resumption matrix's OVERRIDES"
    model = model_factory()
    callback = AlgorithmEngineCallback([factory()], seed=11)
    extra = [L.pytorch.callbacks.ModelCheckpoint(dirpath=save_dir, save_top_k=-1, every_n_epochs=1)] if save_dir else []
    trainer = gpu_trainer(max_epochs=3, limit_train_batches=3, precision="bf16-mixed", callbacks=[callback, *extra],
                          enable_checkpointing=bool(save_dir))
    trainer.fit(model, loader_factory(), ckpt_path=ckpt)
    return model, callback


def _on_cpu(value: Any) -> Any:
    """Nested state with every tensor moved to the CPU (a resumed EMA may hold its copy on the CPU until its next update)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


# --- every algorithm, bf16-mixed ----------------------------------------------------------------


@pytest.mark.parametrize("name", library.__all__)
def test_every_algorithm_trains_in_bf16_mixed_on_the_device(name: str) -> None:
    model, callback = fit_case(name)
    weights = weights_of(model)
    for key, value in weights.items():
        assert value.device.type == DEVICE, f"{key} is on {value.device}, expected {DEVICE}"
        if value.is_floating_point():
            assert torch.isfinite(value).all(), f"{name}: {key} has non-finite values after 9 bf16-mixed steps"
    assert int(callback.state.timestamp.batch) == 9


# --- exact resumption on the device ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["MixUp", "CutMix", "SelectiveBackprop", "EMA", "ProgressiveResizing"])
def test_resumption_is_exact_in_bf16_mixed_on_the_device(name: str, tmp_path: Path, deterministic: None) -> None:
    full_model, full_cb = fit_case(name, save_dir=tmp_path)
    first = tmp_path / "epoch=0-step=3.ckpt"
    assert first.exists(), sorted(p.name for p in tmp_path.iterdir())
    model, callback = fit_case(name, ckpt=first)
    a, b = weights_of(full_model), weights_of(model)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-6, atol=1e-7, msg=lambda m, k=key: f"{name}, {k}: {m}")
    torch.testing.assert_close(_on_cpu(callback.algorithms[0].state_dict()), _on_cpu(full_cb.algorithms[0].state_dict()),
                               rtol=1e-6, atol=1e-7)


# --- fp16 AMP ------------------------------------------------------------------------------------


@cuda_only
def test_gradient_clipping_sees_unscaled_gradients_under_fp16_amp() -> None:
    """Clipping at AFTER_TRAIN_BATCH under 16-mixed equals Lightning's own clipping, which unscales first."""
    ours = tiny_classifier()
    gpu_trainer(max_steps=12, max_epochs=3, precision="16-mixed", callbacks=[AlgorithmEngineCallback([GradientClipping("norm", 0.05)])]).fit(
        ours, image_loader(n=64, batch_size=16)
    )
    theirs = tiny_classifier()
    gpu_trainer(max_steps=12, max_epochs=3, precision="16-mixed", gradient_clip_val=0.05, gradient_clip_algorithm="norm").fit(
        theirs, image_loader(n=64, batch_size=16)
    )
    a, b = weights_of(ours), weights_of(theirs)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
    # The threshold is small enough to bind: an unclipped run ends elsewhere.
    unclipped = tiny_classifier()
    gpu_trainer(max_steps=12, max_epochs=3, precision="16-mixed").fit(unclipped, image_loader(n=64, batch_size=16))
    c = weights_of(unclipped)
    changed = any(not torch.allclose(a[k].float(), c[k].float(), rtol=1e-3, atol=1e-4) for k in a if a[k].is_floating_point())
    assert changed, "clipping at 0.05 changed nothing: the comparison above proves nothing"


@cuda_only
def test_sam_refuses_fp16_amp_with_a_fix() -> None:
    with pytest.raises(Exception, match=r"(?s)SAM.*(16-mixed|fp16).*bf16") as error:
        gpu_trainer(max_steps=1, precision="16-mixed", callbacks=[AlgorithmEngineCallback([SAM()])]).fit(
            tiny_classifier(), image_loader(n=16, batch_size=8)
        )
    assert "16-mixed" in str(error.value), str(error.value)


def test_sam_trains_in_bf16_mixed() -> None:
    model = tiny_classifier()
    gpu_trainer(max_steps=3, precision="bf16-mixed", callbacks=[AlgorithmEngineCallback([SAM()])]).fit(
        model, image_loader(n=48, batch_size=16)
    )
    assert all(torch.isfinite(v).all() for v in weights_of(model).values() if v.is_floating_point())


# --- channels-last --------------------------------------------------------------------------------


def test_channels_last_converts_the_convolutions_and_keeps_the_bf16_step() -> None:
    x = torch.randn(16, 1, 8, 8, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(1))
    converted, contiguous = tiny_classifier(), tiny_classifier()
    bridge = AlgorithmEngineCallback([ChannelsLast()])
    gpu_trainer(max_steps=1, precision="bf16-mixed", callbacks=[bridge]).fit(converted, image_loader(n=16, batch_size=16))
    gpu_trainer(max_steps=1, precision="bf16-mixed", callbacks=[AlgorithmEngineCallback([])]).fit(
        contiguous, image_loader(n=16, batch_size=16)
    )
    convs = [m for m in converted.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in convs)
    assert all(m.weight.device.type == DEVICE for m in convs)
    plain_convs = [m for m in contiguous.modules() if isinstance(m, torch.nn.Conv2d)]
    assert not all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in plain_convs)
    a, b = weights_of(converted), weights_of(contiguous)
    for key in a:
        torch.testing.assert_close(a[key].float(), b[key].float(), rtol=2e-2, atol=2e-3, msg=lambda m, k=key: f"{k}: {m}")
    converted.to(DEVICE).eval()
    contiguous.to(DEVICE).eval()
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        out_converted, out_contiguous = converted((x, None)), contiguous((x, None))
    torch.testing.assert_close(out_converted.float(), out_contiguous.float(), rtol=2e-2, atol=2e-2)


# --- randomness on the device ---------------------------------------------------------------------


def test_state_generators_live_on_the_device_and_depend_only_on_the_position() -> None:
    draws = []
    for _ in range(2):  # two runs (an uninterrupted one and a resumed one) at the same step
        state = State(torch.nn.Linear(1, 1))
        state.seed, state.device = 5, torch.device(DEVICE)
        state.timestamp = Timestamp(epoch=2, batch=7)
        generator = state.generator("MixUp")
        assert generator.device.type == DEVICE
        draws.append(torch.rand(4, device=DEVICE, generator=generator))
    assert draws[0].device.type == DEVICE
    assert torch.equal(draws[0], draws[1])


def test_masks_are_drawn_on_the_device_in_training() -> None:
    """Inside a Trainer, the bridge's state hands out generators on the model's device."""
    seen: dict[str, str] = {}

    class Probe(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            state = bridge.state
            seen["state"] = state.device.type
            seen["generator"] = state.generator("CutOut").device.type
            seen["batch"] = state.batch[0].device.type

    bridge = AlgorithmEngineCallback([library.CutOut(num_holes=1, length=0.5)])
    gpu_trainer(max_steps=1, precision="bf16-mixed", callbacks=[bridge, Probe()]).fit(
        tiny_classifier(), image_loader(n=16, batch_size=16)
    )
    assert seen == {"state": DEVICE, "generator": DEVICE, "batch": DEVICE}


# --- host-device synchronisation ------------------------------------------------------------------


def training_state(device: str) -> State:
    """A State as the bridge holds it at step 60 of 10 epochs, with an image batch and outputs on ``device``."""
    state = State(torch.nn.Linear(1, 1))
    state.seed, state.device = 3, torch.device(device)
    state.max_duration = "10ep"
    state.timestamp = Timestamp(epoch=6, batch=60)
    g = torch.Generator(device=device).manual_seed(0)
    state.batch = (torch.randn(32, 3, 16, 16, device=device, generator=g),
                   torch.randint(0, 10, (32,), device=device, generator=g))
    state.outputs = torch.randn(32, 10, device=device, generator=g)
    return state


BATCH_ALGORITHMS = {
    "MixUp": lambda: library.MixUp(alpha=0.2),
    "CutMix": lambda: library.CutMix(alpha=1.0),
    "CutOut": lambda: library.CutOut(num_holes=2, length=0.25),
    "ColOut": lambda: library.ColOut(),
    "ProgressiveResizing(resize)": lambda: library.ProgressiveResizing(mode="resize"),
    "ProgressiveResizing(crop)": lambda: library.ProgressiveResizing(mode="crop"),
    "LabelSmoothing": lambda: library.LabelSmoothing(0.1),
}
DATA_EVENTS = (Event.AFTER_DATALOADER, Event.BEFORE_FORWARD, Event.BEFORE_LOSS)


def apply_data_events(algorithm: Any, state: State) -> int:
    ran = 0
    for event in DATA_EVENTS:
        if algorithm.match(event, state):
            algorithm.apply(event, state, Logger())
            ran += 1
    return ran


def without_sync(call: Any) -> Any:
    """Run ``call()`` with CUDA's sync-debug mode raising on any host-device synchronisation."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return call()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("name", sorted(BATCH_ALGORITHMS))
def test_batch_algorithms_change_the_batch(name: str) -> None:
    """Each batch algorithm acts on a device batch and leaves it on the device (runs in the dry run too)."""
    state = training_state(DEVICE)
    before = state.batch[0].clone()
    assert apply_data_events(BATCH_ALGORITHMS[name](), state) > 0
    assert state.batch[0].device.type == DEVICE
    if name != "LabelSmoothing":
        assert state.batch[0].shape != before.shape or not torch.equal(state.batch[0], before), f"{name} changed nothing"


@cuda_only
@pytest.mark.parametrize("name", sorted(BATCH_ALGORITHMS))
def test_batch_algorithms_change_the_batch_without_a_host_device_sync(name: str) -> None:
    """In training the algorithms draw their scalars (mixing coefficient, boxes) on the host: no sync."""
    assert apply_data_events(BATCH_ALGORITHMS[name](), training_state("cuda")) > 0  # warm-up (kernel loading)
    algorithm, state = BATCH_ALGORITHMS[name](), training_state("cuda")
    without_sync(lambda: apply_data_events(algorithm, state))
    assert state.batch[0].device.type == "cuda"


def _functional_calls(device: str) -> dict[str, Any]:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(32, 3, 16, 16, device=device)
    y = torch.randint(0, 10, (32,), device=device)
    logits = torch.randn(32, 10, device=device)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 10)).to(device)

    def per_example_loss(outputs: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, target, reduction=reduction)

    return {
        "smooth_labels": lambda: F.smooth_labels(logits, y, 0.1),
        "colout_batch": lambda: F.colout_batch(x, generator=g),
        "resize_batch(resize)": lambda: F.resize_batch(x, y, scale_factor=0.5, mode="resize", generator=g),
        "select_using_loss": lambda: F.select_using_loss(x, y, net, per_example_loss, keep=0.5, generator=g),
        "mixup_batch": lambda: F.mixup_batch(x, y, alpha=0.2, generator=g),
        "cutmix_batch": lambda: F.cutmix_batch(x, y, alpha=1.0, generator=g),
        "cutout_batch": lambda: F.cutout_batch(x, num_holes=2, length=0.25, generator=g),
        "resize_batch(crop)": lambda: F.resize_batch(x, y, scale_factor=0.5, mode="crop", generator=g),
    }


SYNC_FREE_FUNCTIONS = ["smooth_labels", "colout_batch", "resize_batch(resize)", "select_using_loss"]
#: These draw a scalar (mixing coefficient, box, offset) from the generator they are given and use it
#: on the host: with a CUDA generator that is one device-to-host copy. The algorithms pass a CPU generator.
SYNCING_FUNCTIONS = ["mixup_batch", "cutmix_batch", "cutout_batch", "resize_batch(crop)"]


@pytest.mark.parametrize("name", SYNC_FREE_FUNCTIONS + SYNCING_FUNCTIONS)
def test_functional_forms_run_on_device_tensors(name: str) -> None:
    out = _functional_calls(DEVICE)[name]()
    first = out[0] if isinstance(out, tuple) else out
    assert first.device.type == DEVICE


@cuda_only
@pytest.mark.parametrize("name", SYNC_FREE_FUNCTIONS)
def test_functional_forms_with_a_device_generator_do_not_sync(name: str) -> None:
    call = _functional_calls("cuda")[name]
    call()  # warm-up (kernel loading, cuBLAS handles)
    without_sync(call)


@cuda_only
@pytest.mark.parametrize("name", SYNCING_FUNCTIONS)
@pytest.mark.xfail(strict=True, reason="given a CUDA generator, the functional form draws its scalars from it: one sync")
def test_functional_forms_sync_when_given_a_device_generator(name: str) -> None:
    call = _functional_calls("cuda")[name]
    call()
    without_sync(call)


def test_the_dry_run_switch_is_explicit() -> None:
    """The file runs on a GPU, or on the CPU only when asked; never silently on the wrong device."""
    assert CUDA or DRY_RUN
    assert math.isfinite(float(torch.randn(1, device=DEVICE)))


def test_ema_average_follows_the_model_to_the_device_after_a_resume(tmp_path: Path) -> None:
    """A checkpoint's EMA tensors load on the CPU; from FIT_START on they live where the model does."""
    seen: dict[str, str] = {}

    def fit(ckpt: Path | None) -> AlgorithmEngineCallback:
        ema = library.EMA(half_life="2ba")
        bridge = AlgorithmEngineCallback([ema], seed=1)

        class Probe(L.Callback):
            def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
                if ckpt is not None and "ema" not in seen:
                    seen["ema"] = next(iter(ema._ema.values())).device.type
                    seen["model"] = next(trainer.lightning_module.parameters()).device.type

        checkpoints = [L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1)]
        gpu_trainer(max_epochs=2, limit_train_batches=2, enable_checkpointing=ckpt is None,
                    callbacks=[bridge, Probe(), *(checkpoints if ckpt is None else [])]).fit(
            tiny_classifier(), image_loader(n=32), ckpt_path=ckpt)
        return bridge

    fit(None)
    fit(min(tmp_path.glob("*.ckpt"), key=lambda p: p.stat().st_mtime))
    assert seen == {"ema": DEVICE, "model": DEVICE}
