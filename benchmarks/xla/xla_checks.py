"""The algorithms on XLA, run on the CPU (``PJRT_DEVICE=CPU``): what breaks lazy execution, per step.

Run in the venv that ``benchmarks/xla/setup_xla_env.sh`` builds (torch 2.9.0 + torch_xla 2.9.0):

    PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/xla/xla_checks.py --out xla_checks.json

Two parts:

1. **Functional forms on XLA tensors**: each form runs on XLA and on the CPU with the same inputs
   and the same seeded CPU generator; the results must agree. After two warm-up calls, a third
   call with the same shapes is measured: host transfers, ``.item()``-style reads and new graphs.
2. **Lightning on the XLA device**: ``lightning.Trainer`` with Lightning's ``XLAAccelerator``
   (``SingleDeviceXLAStrategy``) and the bridge, for Lightning alone, an empty bridge, the mild and
   medium recipes and each shape-changing algorithm. Per optimizer step: transfers from the device
   (``TransferFromDeviceTime`` samples), scalar reads (``aten::_local_scalar_dense``: ``.item()``,
   ``bool()``, ``float()`` on an XLA tensor, each one a graph execution before the step's end), new
   graphs (``UncachedCompile``), and which source line asked for each host read.

Lightning refuses ``accelerator="tpu"`` here because no TPU chip is attached; the accelerator
below is Lightning's own ``XLAAccelerator`` told that one (CPU-backed) XLA device is available.
torch_xla's TPU discovery would ask the cloud metadata server; this script makes that query
raise instead, so it never leaves the machine.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla._internal.tpu as _tpu  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402


def _no_metadata(key: str) -> str:
    raise OSError(f"not a TPU VM: refusing to query the cloud metadata server for {key!r}")


_tpu._get_metadata = _no_metadata  # TPU discovery must fail here, not go to the network

import lightning as L  # noqa: E402
from lightning.pytorch.accelerators import XLAAccelerator  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import composer_bridge.functional as cf  # noqa: E402
from composer_bridge import AlgorithmEngineCallback, ComposerClassifier, ComposerModule, recipes  # noqa: E402
from composer_bridge.algorithms import ProgressiveResizing, SelectiveBackprop, SeqLengthWarmup  # noqa: E402
from composer_bridge.models import GPT, ResNetCNN  # noqa: E402

XLA = torch_xla.device()


# --- counting ----------------------------------------------------------------------------------
def counts() -> dict[str, int]:
    """The XLA runtime's running totals this script compares before and after."""
    def samples(name: str) -> int:
        data = met.metric_data(name)
        return int(data[0]) if data else 0

    return {
        "transfers_from_device": samples("TransferFromDeviceTime"),
        "scalar_reads": int(met.counter_value("aten::_local_scalar_dense") or 0),
        "new_graphs": int(met.counter_value("UncachedCompile") or 0),
        "compiles": samples("CompileTime"),
        "executions": samples("ExecuteTime"),
    }


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


_HOST_READS = {
    torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__,
    torch.Tensor.__index__, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy,
}


class HostReads(TorchFunctionMode):
    """Names the source line of every read of an XLA tensor's value from Python (or copy to the CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        first = args[0] if args else None
        reads = func in _HOST_READS or (func is torch.Tensor.to and _to_cpu(args, kwargs))
        if reads and isinstance(first, torch.Tensor) and first.device.type == "xla":
            self.where[_caller()] += 1
        return func(*args, **kwargs)


def _to_cpu(args: tuple, kwargs: dict) -> bool:
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"


def _caller() -> str:
    """The innermost frame in composer_bridge, else in lightning, else outside torch."""
    frames = traceback.extract_stack()[:-3]
    for marker in ("composer_bridge", "lightning"):
        for frame in reversed(frames):
            if f"/{marker}/" in frame.filename:
                path = frame.filename.split(f"/{marker}/", 1)[1]
                return f"{marker}/{path}:{frame.lineno} ({frame.name})"
    for frame in reversed(frames):
        if "/torch/" not in frame.filename and "/torch_xla/" not in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno} ({frame.name})"
    return "torch"


# --- part 1: functional forms ----------------------------------------------------------------------
def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.allclose(a.cpu().float(), b.float(), rtol=1e-5, atol=1e-5)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _per_example_loss(logits: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    return F.cross_entropy(logits, target, reduction=reduction)


#: functional forms that abort the whole process under torch_xla 2.9.0 on the CPU (skipped unless asked)
ABORTS = {
    "colout_batch": "aborts the process: XLA 'Check failed: buffer != nullptr' (xla/shape.h) when the result of a "
                    "sort of device indices feeds index_select; colout sorts its kept rows on the device after "
                    "copying them there. Sorting before the copy runs (see docs/gpu-tpu.md).",
}


def functional_checks(include_aborting: bool = False) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, 16, 16, generator=g)
    y = torch.randint(0, 4, (16,), generator=g)
    logits = torch.randn(16, 4, generator=g)
    tokens = {"input_ids": torch.randint(0, 50, (4, 32), generator=g),
              "attention_mask": torch.ones(4, 32, dtype=torch.long)}
    linear = torch.nn.Linear(3 * 16 * 16, 4)
    torch.manual_seed(0)
    ema_cpu, live_cpu = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)

    def on_xla(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(XLA)
        if isinstance(value, dict):
            return {k: on_xla(v) for k, v in value.items()}
        return value

    def classify(inputs: torch.Tensor) -> torch.Tensor:
        return linear.to(inputs.device)(inputs.flatten(1))

    torch.manual_seed(0)
    convnet = ResNetCNN(num_classes=4, in_channels=3, widths=(8, 16), blocks_per_stage=1).eval()
    cf.apply_blurpool(convnet, min_channels=1)
    cf.apply_channels_last(convnet)
    on_device = {}

    def surgered(dev: Any) -> torch.nn.Module:
        if dev is _identity:
            return convnet
        if "xla" not in on_device:
            on_device["xla"] = copy.deepcopy(convnet).to(XLA)
        return on_device["xla"]

    def ema_step(device: str) -> torch.Tensor:
        ema, live = (torch.nn.Linear(8, 4).to(device) for _ in range(2))
        ema.load_state_dict(ema_cpu.state_dict())
        live.load_state_dict(live_cpu.state_dict())
        cf.compute_ema(live, ema, smoothing=0.9)
        return ema.weight

    cases = {
        "smooth_labels": lambda dev: cf.smooth_labels(dev(logits), dev(y), smoothing=0.1),
        "mixup_batch": lambda dev: cf.mixup_batch(dev(x), dev(y), alpha=0.2, generator=_generator()),
        "cutmix_batch": lambda dev: cf.cutmix_batch(dev(x), dev(y), alpha=1.0, generator=_generator()),
        "cutout_batch": lambda dev: cf.cutout_batch(dev(x), length=0.5, generator=_generator()),
        "colout_batch": lambda dev: cf.colout_batch((dev(x), dev(y)), generator=_generator()),
        "resize_batch(resize)": lambda dev: cf.resize_batch(dev(x), dev(y), 0.5, mode="resize"),
        "resize_batch(crop)": lambda dev: cf.resize_batch(dev(x), dev(y), 0.5, mode="crop", generator=_generator()),
        "select_using_loss": lambda dev: cf.select_using_loss(dev(x), dev(y), classify, _per_example_loss,
                                                              keep=0.5, generator=_generator()),
        "set_batch_sequence_length": lambda dev: cf.set_batch_sequence_length(dev(tokens), 16),
        "compute_ema": lambda dev: ema_step("cpu" if dev is _identity else XLA),
        "apply_blurpool + apply_channels_last (forward)": lambda dev: surgered(dev)(dev(x)),
    }
    rows = []
    for name, case in cases.items():
        row: dict[str, Any] = {"function": name}
        if name in ABORTS and not include_aborting:
            row["skipped"] = ABORTS[name]
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        try:
            expected = case(_identity)
            first = case(on_xla)
            torch_xla.sync()
            row["matches_cpu"] = _same(first, expected)
            case(on_xla)  # a second warm-up call: the first one's graph also uploads what it created
            torch_xla.sync()
            reads = HostReads()
            before = counts()
            with reads:
                result = case(on_xla)  # held, so that the sync below runs its graph
                torch_xla.sync()
            row.update(delta(before, counts()))
            del result
            row["host_reads_at"] = dict(reads.where)
        except Exception as error:  # report and go on: one failing form must not hide the others
            row["error"] = f"{type(error).__name__}: {error}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _identity(value: Any) -> Any:
    return value


# --- part 2: Lightning on the XLA device ----------------------------------------------------------
class CPUBackedXLA(XLAAccelerator):
    """Lightning's XLAAccelerator with the one CPU-backed device PJRT_DEVICE=CPU provides."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def parse_devices(devices: Any) -> int:
        if devices not in (1, "1", "auto"):
            raise ValueError(f"CPUBackedXLA(devices={devices!r}): PJRT_DEVICE=CPU offers one device; use devices=1.")
        return 1

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("xla", 0)]


class StepMeter(L.Callback):
    """Counts, per optimizer step, what the XLA runtime did; records the model's input shapes."""

    def __init__(self, reads: HostReads) -> None:
        self.reads = reads
        self.steps: list[dict[str, int]] = []
        self.reads_after_warmup: collections.Counter[str] = collections.Counter()
        self.shapes: set[tuple[int, ...]] = set()
        self.warmup = 2

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last = counts()
        self._reads_at_step_start = collections.Counter(self.reads.where)
        pl_module.register_forward_pre_hook(self._record_shape)

    def _record_shape(self, module: torch.nn.Module, args: tuple) -> None:
        batch = args[0]
        first = batch["input_ids"] if isinstance(batch, dict) else batch[0]
        self.shapes.add(tuple(first.shape))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = counts()
        self.steps.append(delta(self._last, now))
        self._last = now
        if len(self.steps) > self.warmup:
            self.reads_after_warmup.update(collections.Counter(self.reads.where) - self._reads_at_step_start)
        self._reads_at_step_start = collections.Counter(self.reads.where)


class TokenModel(ComposerModule):
    """A one-layer GPT over 12 tokens: the language model for SeqLengthWarmup."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gpt = GPT(vocab_size=12, block_size=16, d_model=16, n_layers=1, n_heads=2, dropout=0.0)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.gpt(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        targets = batch[1][:, : outputs.shape[1]]
        return F.cross_entropy(outputs.reshape(-1, 12).float(), targets.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def image_setup(size: int = 16) -> tuple[L.LightningModule, DataLoader]:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (256,), generator=g)
    x = torch.randn(256, 3, size, size, generator=g) + y.view(-1, 1, 1, 1).float()
    torch.manual_seed(0)
    net = ResNetCNN(num_classes=4, in_channels=3, widths=(8, 16), blocks_per_stage=1)
    model = ComposerClassifier(net, num_classes=4, optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    return model, DataLoader(TensorDataset(x, y), batch_size=16)


def token_setup() -> tuple[L.LightningModule, DataLoader]:
    tokens = torch.randint(0, 12, (256, 17), generator=torch.Generator().manual_seed(0))
    return TokenModel(), DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=16)


def _scaled_ema() -> dict[str, str]:
    return {"half_life": "2ba", "update_interval": "1ba"}


def _small_blurpool() -> dict[str, int]:
    # the small test network's stride-2 convolution has 8 input channels, under BlurPool's default 16
    return {"min_channels": 1}


def trainer_configs() -> dict[str, tuple[Any, Any]]:
    """name -> (algorithm list or None for no bridge, model/data factory)."""
    return {
        "lightning alone": (None, image_setup),
        "empty bridge": ([], image_setup),
        "mild": (lambda: recipes.vision("mild", ema=_scaled_ema(), blurpool=_small_blurpool()), image_setup),
        # SAM every 3 steps so that it acts within the run (the recipe's 10 would not)
        "medium": (lambda: recipes.vision("medium", ema=_scaled_ema(), blurpool=_small_blurpool(),
                                           sam={"interval": 3}), image_setup),
        "ProgressiveResizing": (lambda: [ProgressiveResizing(initial_scale=0.5, delay_fraction=0.2,
                                                             finetune_fraction=0.2, size_increment=4)], image_setup),
        "SelectiveBackprop": (lambda: [SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=2)], image_setup),
        "SeqLengthWarmup": (lambda: [SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=16,
                                                     step_size=4)], token_setup),
    }


def trainer_check(name: str, algorithms: Any, setup: Any, steps: int) -> dict[str, Any]:
    model, loader = setup()
    reads = HostReads()
    meter = StepMeter(reads)
    callbacks: list[L.Callback] = [meter]
    if algorithms is not None:
        callbacks.append(AlgorithmEngineCallback(algorithms() if callable(algorithms) else algorithms, seed=7))
    trainer = L.Trainer(accelerator=CPUBackedXLA(), devices=1, max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=callbacks)
    start = time.perf_counter()
    with reads:
        trainer.fit(model, loader)
    steady = meter.steps[meter.warmup:]
    row = {
        "config": name,
        "algorithms": [type(a).__name__ for a in (callbacks[1].algorithms if len(callbacks) > 1 else [])],
        "strategy": type(trainer.strategy).__name__,
        "device": str(trainer.strategy.root_device),
        "steps": len(meter.steps),
        "per_step": meter.steps,
        "after_warmup_per_step": {k: sum(s[k] for s in steady) / max(len(steady), 1) for k in steady[0]} if steady else {},
        "new_graphs_total": sum(s["new_graphs"] for s in meter.steps),
        "distinct_input_shapes": sorted(meter.shapes),
        "host_reads_after_warmup_at": dict(meter.reads_after_warmup),
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps({k: v for k, v in row.items() if k != "per_step"}), flush=True)
    return row


def use_host_generators_for_xla() -> None:
    """Workaround, off by default: ``State.generator(key, xla_device)`` hands out a CPU generator.

    ``torch.Generator(device="xla")`` raises ("XLA device type not an accelerator"), so every
    algorithm that asks the state for a generator on the batch's device (MixUp, CutMix, ColOut,
    SelectiveBackprop, StochasticDepth, RandAugment, AugMix) fails on XLA. The algorithms already
    draw on the generator's device and copy the draw to the batch's device, so a CPU generator is
    enough: the draw is then uploaded (host to device), which does not cut XLA's graph.
    """
    from composer_bridge import State

    original = State.generator

    def generator(self: State, key: str, device: Any = None) -> torch.Generator:
        target = torch.device(device) if device is not None else self.device
        if target.type == "xla":
            return original(self, f"{key}/{target}", "cpu")
        return original(self, key, device)

    State.generator = generator  # type: ignore[method-assign]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The Trainer results as the table in docs/gpu-tpu.md."""
    lines = ["| configuration | transfers to host / step | scalar reads / step | new graphs after warm-up "
             "| graphs in the run | input shapes | seconds |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['config']} | fails: {row['error'].splitlines()[0][:120]} | | | | | |")
            continue
        steady = row["after_warmup_per_step"]
        after = sum(s["new_graphs"] for s in row["per_step"][2:])
        shapes = ", ".join("x".join(map(str, shape)) for shape in row["distinct_input_shapes"])
        lines.append(f"| {row['config']} | {steady['transfers_from_device']:.2f} | {steady['scalar_reads']:.2f} "
                     f"| {after} | {row['new_graphs_total']} | {shapes} | {row['seconds']} |")
    return "\n".join(lines)


def run_isolated(name: str, steps: int, host_generators: bool) -> dict[str, Any]:
    """One Trainer config in a fresh process: its graph count is not lowered by graphs an earlier
    config compiled, and an abort inside XLA ends only that config."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "one.json"
        command = [sys.executable, __file__, "--skip-functional", "--in-process", "--only", name,
                   "--steps", str(steps), "--out", str(out)] + (["--host-generators"] if host_generators else [])
        done = subprocess.run(command, capture_output=True, text=True)
        if out.exists():
            rows = json.loads(out.read_text())["trainer"]
            if rows:
                return rows[0]
        return {"config": name, "error": f"process ended with {done.returncode}", "stderr": done.stderr[-3000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write all results as JSON here")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per Trainer run (default 8)")
    parser.add_argument("--only", nargs="*", default=None, help="Trainer configs to run (default: all)")
    parser.add_argument("--skip-functional", action="store_true")
    parser.add_argument("--skip-trainer", action="store_true")
    parser.add_argument("--table", type=Path, default=None,
                        help="print the Markdown table of an earlier --out file and exit")
    parser.add_argument("--in-process", action="store_true",
                        help="run the Trainer configs in this process (default: one fresh process each)")
    parser.add_argument("--host-generators", action="store_true",
                        help="apply use_host_generators_for_xla() first (the workaround; see its docstring)")
    parser.add_argument("--include-aborting", action="store_true",
                        help="also run the functional forms known to abort the process (ABORTS)")
    args = parser.parse_args()
    if args.table:
        print(markdown_table(json.loads(args.table.read_text())["trainer"]))
        return
    if os.environ.get("PJRT_DEVICE") != "CPU":
        print(f"note: PJRT_DEVICE={os.environ.get('PJRT_DEVICE')!r}; these checks were written for CPU", file=sys.stderr)
    if args.host_generators:
        use_host_generators_for_xla()
    import lightning
    results: dict[str, Any] = {
        "host_generators_workaround": args.host_generators,
        "versions": {"torch": torch.__version__, "torch_xla": torch_xla.__version__,
                     "lightning": lightning.__version__, "python": sys.version.split()[0]},
        "device": str(XLA), "pjrt_device": os.environ.get("PJRT_DEVICE"), "cpus": os.cpu_count(),
    }
    print(json.dumps(results), flush=True)
    started = time.perf_counter()
    if not args.skip_functional:
        results["functional"] = functional_checks(args.include_aborting)
    results["trainer"] = []
    for name, (algorithms, setup) in trainer_configs().items():
        if args.skip_trainer or (args.only and name not in args.only):
            continue
        if not args.in_process:
            row = run_isolated(name, args.steps, args.host_generators)
            if "XLA device type not an accelerator" in row.get("error", "") and not args.host_generators:
                print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
                results["trainer"].append(row)
                row = run_isolated(name, args.steps, True)  # again, with the workaround
                row["config"] = f"{name} (host generators)"
            print(json.dumps({k: v for k, v in row.items() if k not in ("per_step", "traceback")}), flush=True)
            results["trainer"].append(row)
        else:
            try:
                results["trainer"].append(trainer_check(name, algorithms, setup, args.steps))
            except Exception as error:
                row = {"config": name, "error": f"{type(error).__name__}: {error}",
                       "traceback": traceback.format_exc()[-3000:]}
                print(json.dumps(row), flush=True)
                results["trainer"].append(row)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    results["seconds"] = round(time.perf_counter() - started, 1)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    print(markdown_table(results["trainer"]))
    print(f"done in {results['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
