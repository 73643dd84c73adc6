"""On a CUDA GPU: mixed precision, channels-last, device-side randomness and host-device syncs.

Skipped without CUDA (CI has none). The whole resumption matrix also runs on a GPU with
``COMPOSER_BRIDGE_TEST_ACCELERATOR=gpu`` (see tests/support.py and docs/gpu-tpu.md).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import image_loader, quiet_trainer, tiny_classifier, weights_of

import composer_bridge.functional as F
from composer_bridge import AlgorithmEngineCallback, State
from composer_bridge.algorithms import SAM, ChannelsLast, GradientClipping

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpu_trainer(**overrides: Any):
    return quiet_trainer(accelerator="gpu", devices=1, **overrides)


def test_gradient_clipping_sees_unscaled_gradients_under_fp16_amp() -> None:
    """Clipping at AFTER_TRAIN_BATCH under 16-mixed equals Lightning's own clipping, which unscales first."""
    ours = tiny_classifier()
    gpu_trainer(max_steps=4, precision="16-mixed", callbacks=[AlgorithmEngineCallback([GradientClipping("norm", 0.05)])]).fit(
        ours, image_loader(n=64, batch_size=16)
    )
    theirs = tiny_classifier()
    gpu_trainer(max_steps=4, precision="16-mixed", gradient_clip_val=0.05, gradient_clip_algorithm="norm").fit(
        theirs, image_loader(n=64, batch_size=16)
    )
    a, b = weights_of(ours), weights_of(theirs)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}")


def test_sam_refuses_fp16_amp_with_a_fix() -> None:
    with pytest.raises(Exception, match=r"(?s)SAM.*(16-mixed|fp16).*bf16"):
        gpu_trainer(max_steps=1, precision="16-mixed", callbacks=[AlgorithmEngineCallback([SAM()])]).fit(
            tiny_classifier(), image_loader(n=16, batch_size=8)
        )


def test_channels_last_converts_the_convolutions_and_keeps_the_outputs() -> None:
    model = tiny_classifier().cuda()
    x = torch.randn(16, 1, 8, 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        before = model((x, None))
    bridge = AlgorithmEngineCallback([ChannelsLast()])
    gpu_trainer(max_steps=1, precision="bf16-mixed", callbacks=[bridge]).fit(model, image_loader(n=16, batch_size=16))
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in convs)
    fresh = tiny_classifier().cuda()
    F.apply_channels_last(fresh)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        after = fresh((x, None))
    torch.testing.assert_close(after.float(), before.float(), rtol=2e-2, atol=2e-2)


def test_state_generators_live_on_the_gpu_and_repeat_by_position() -> None:
    state = State(torch.nn.Linear(1, 1))
    state.seed, state.device = 5, torch.device("cuda")
    generator = state.generator("MixUp")
    assert generator.device.type == "cuda"
    first = torch.rand(4, device="cuda", generator=generator)
    again = torch.rand(4, device="cuda", generator=state.generator("MixUp"))
    assert torch.equal(first, again)


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(32, 3, 16, 16, device="cuda", generator=generator)
    y = torch.randint(0, 10, (32,), device="cuda", generator=generator)
    return x, y, generator


SYNC_FREE = {
    "smooth_labels": lambda x, y, g: F.smooth_labels(torch.randn(32, 10, device="cuda"), y, 0.1),
    "cutout_batch": lambda x, y, g: F.cutout_batch(x, num_holes=2, length=0.25, generator=g),
    "colout_batch": lambda x, y, g: F.colout_batch(x, generator=g),
    "resize_batch": lambda x, y, g: F.resize_batch(x, y, scale_factor=0.5, generator=g),
    "resize_batch(crop)": lambda x, y, g: F.resize_batch(x, y, scale_factor=0.5, mode="crop", generator=g),
    "mixup_batch(mixing given)": lambda x, y, g: F.mixup_batch(x, y, mixing=0.3, generator=g),
}
# These draw a Python scalar (the mixing coefficient, the box) from the device generator: one sync each.
SYNCING = {
    "mixup_batch": lambda x, y, g: F.mixup_batch(x, y, alpha=0.2, generator=g),
    "cutmix_batch": lambda x, y, g: F.cutmix_batch(x, y, alpha=1.0, generator=g),
}


def _run_without_syncs(fn: Any) -> None:
    x, y, g = _batch()
    fn(x, y, g)  # warm-up: first calls may sync to load kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(x, y, g)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("name", sorted(SYNC_FREE))
def test_batch_algorithms_run_without_a_host_device_sync(name: str) -> None:
    _run_without_syncs(SYNC_FREE[name])


@pytest.mark.parametrize("name", sorted(SYNCING))
@pytest.mark.xfail(strict=True, reason="draws its mixing coefficient/box as a Python number from the device generator")
def test_mixing_algorithms_sync_once_to_draw_their_coefficient(name: str) -> None:
    _run_without_syncs(SYNCING[name])
