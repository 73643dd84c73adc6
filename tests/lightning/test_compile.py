"""torch.compile and the bridge: surgery at INIT comes before the first compiled call, so the
compiled network is the altered one, and a compiled network trains like the eager one.

The network inside the LightningModule is compiled in place (``nn.Module.compile``), the order
docs/gpu-tpu.md recommends. The backend is a recorder in front of ``aot_eager``: it keeps the code
of every graph Dynamo captured (the check that surgery is kept reads it), and ``aot_eager`` traces
forward and backward through AOTAutograd as inductor does, without inductor's C++ compilation
(a C++ compiler run per graph, slow on a 2-core CI machine): what decides whether surgery is kept is
Dynamo's capture, which is the same for every backend.
"""

from __future__ import annotations

import pytest
import torch
from helpers.support import image_loader, quiet_trainer, tiny_classifier
from helpers.tolerances import assert_within, rounding_bound

from composer_bridge import AlgorithmEngineCallback, recipes


def _mild() -> list:
    # EMA scaled to a 6-step run; BlurPool reaches the 1-channel stem of the tiny model
    return recipes.vision("mild", ema={"half_life": "2ba", "update_interval": "1ba"}, blurpool={"min_channels": 1})


STEPS, REDUCTIONS = 6, 5000


def _train(model: torch.nn.Module, algorithms: list) -> dict[str, torch.Tensor]:
    trainer = quiet_trainer(max_steps=STEPS, callbacks=[AlgorithmEngineCallback(algorithms, seed=7)])
    trainer.fit(model, image_loader(n=48, batch_size=8))
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _recording_backend(graphs: list[str]):
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm.code)
        return aot_eager(gm, example_inputs)

    return backend


@pytest.mark.timeout(240)
def test_compiled_network_keeps_surgery_and_trains_like_the_eager_one() -> None:
    torch._dynamo.reset()
    eager = _train(tiny_classifier(), _mild())
    without_blurpool = _train(tiny_classifier(), recipes.vision("mild", blurpool=None,
                                                                ema={"half_life": "2ba", "update_interval": "1ba"}))

    model = tiny_classifier()
    graphs: list[str] = []
    # compiled before fit, and already run once: the first graph is the network without BlurPool
    model.module.compile(backend=_recording_backend(graphs))
    with torch.no_grad():
        model.module(torch.zeros(2, 1, 8, 8))
    assert len(graphs) == 1 and "blur_filter" not in graphs[0]
    compiled = _train(model, _mild())

    # BlurPool replaced the convolutions at INIT, inside the compiled module, and Dynamo noticed:
    # every graph captured during training convolves with the blur filters
    assert type(model.module).__name__ == "ResNetCNN" and model.module._compiled_call_impl is not None
    assert any(type(m).__name__ == "BlurConv2d" for m in model.module.modules())
    training_graphs = graphs[1:]
    assert training_graphs and all("blur_filter" in code for code in training_graphs)
    # ProgressiveResizing changes the image size at most steps; Dynamo marks the size dynamic after
    # the first change, so the graphs stay few (the first shape, then one with dynamic sizes)
    assert len(training_graphs) <= 3, len(training_graphs)

    # the compiled run follows the eager run with surgery (not the one without it), up to what float32 rounding may
    # change (helpers/tolerances.py): aot_eager runs the same ATen kernels, which today agree bit for bit, but MKL and
    # oneDNN may block differently with the buffers' alignment, and a CPU's vector width reorders sums. Each step's
    # gradients are chains of sums of about REDUCTIONS terms end to end (BatchNorm over 8 x 8 x 8 = 512 values three
    # times and 8 x 4 x 4 = 128 three times, 3 x 3 convolutions over 9 to 144 inputs, their weight gradients over the
    # same 512 or 128 positions, the blur filters, the pool, the head, the loss; the backward pass as much again),
    # each off by at most its length x eps x the magnitudes summed, no bigger than the largest move; SGD (momentum
    # 0.9) and EMA are linear in the gradients, so a weight is off by at most REDUCTIONS x eps x the run's largest
    # move, plus one ulp of the weight a step; the two runs, twice that.
    assert compiled.keys() == eager.keys(), sorted(set(compiled) ^ set(eager))
    start = {k: v.detach().clone() for k, v in tiny_classifier().named_parameters()}
    largest_move = max((eager[k] - start[k]).abs().max().item() for k in start if k in eager)
    for key, value in eager.items():
        bound = 2 * (rounding_bound(REDUCTIONS, largest_move) + rounding_bound(STEPS, value.abs()))
        assert_within(compiled[key], value, bound, key)
    shared = eager.keys() & without_blurpool.keys()  # BlurConv2d renames the wrapped convolutions
    assert "module.fc.weight" in shared
    distance = max((eager[k] - without_blurpool[k]).abs().max().item() for k in shared)
    assert distance > 1e-3
