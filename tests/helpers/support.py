"""Small real pieces the tests share: data, models, a quiet Trainer, a 2-process DDP runner.

The Lightning-facing tests run against either Lightning package: ``L`` here is ``lightning.pytorch``
(the default) or ``pytorch_lightning`` (``COMPOSER_BRIDGE_TEST_LIGHTNING=pytorch_lightning``; CI runs
both), and ``ComposerClassifier``/``ComposerModule`` are the flavour that package's Trainer accepts.
Tests write ``L.Trainer``, ``L.LightningModule``, ``L.callbacks.ModelCheckpoint``, ``L.loggers.CSVLogger``.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge.models import ResNetCNN

#: The Lightning package under test: "lightning" (lightning.pytorch) or "pytorch_lightning".
LIGHTNING_PACKAGE = os.environ.get("COMPOSER_BRIDGE_TEST_LIGHTNING", "lightning")
if LIGHTNING_PACKAGE == "pytorch_lightning":
    import pytorch_lightning as L

    from composer_bridge.pl import ComposerClassifier, ComposerModule  # noqa: F401 - for the tests
elif LIGHTNING_PACKAGE == "lightning":
    import lightning.pytorch as L

    from composer_bridge import ComposerClassifier, ComposerModule  # noqa: F401 - for the tests
else:
    raise ValueError(
        f"COMPOSER_BRIDGE_TEST_LIGHTNING={LIGHTNING_PACKAGE!r}: choose 'lightning' or 'pytorch_lightning'."
    )
REPO = Path(__file__).resolve().parents[2]


def load_script(relative_path: str, name: str) -> ModuleType:
    """Import one of the repository's scripts (e.g. ``benchmarks/pareto.py``) by path, as module ``name``.

    The module is registered in ``sys.modules`` first: dataclasses look their module up there.
    """
    spec = importlib.util.spec_from_file_location(name, REPO / relative_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def image_dataset(n: int = 64, size: tuple[int, int] = (8, 8), channels: int = 1, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Random images whose class is learnable (the class shifts the mean of the image)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, channels, *size, generator=g) + y.view(-1, 1, 1, 1).float()
    return TensorDataset(x, y)


def image_loader(n: int = 64, batch_size: int = 16, shuffle: bool = False, **kwargs: Any) -> DataLoader:
    """A loader over :func:`image_dataset`; unshuffled unless asked (shuffling is seeded)."""
    return DataLoader(
        image_dataset(n, **kwargs), batch_size=batch_size, shuffle=shuffle,
        generator=torch.Generator().manual_seed(0) if shuffle else None,
    )


def tiny_classifier(classes: int = 4, channels: int = 1, lr: float = 0.05) -> ComposerClassifier:
    """A ComposerClassifier around a 2-block ResNet-style CNN (a few thousand parameters)."""
    torch.manual_seed(0)
    net = ResNetCNN(num_classes=classes, in_channels=channels, widths=(8, 16), blocks_per_stage=1)
    return ComposerClassifier(net, num_classes=classes, optimizer=lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9))


class PlainLinear(L.LightningModule):
    """A plain LightningModule the usual way: ``Linear(4, 2)``, inline cross-entropy, SGD at ``lr``."""

    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 2)
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def quiet_trainer(**overrides: Any) -> L.Trainer:
    """A CPU Trainer with no logger, checkpointing, progress bar or model summary unless overridden."""
    # COMPOSER_BRIDGE_TEST_ACCELERATOR=gpu (and _PRECISION=bf16-mixed) run the Trainer tests on a GPU.
    options: dict[str, Any] = dict(
        accelerator=os.environ.get("COMPOSER_BRIDGE_TEST_ACCELERATOR", "cpu"), devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, max_epochs=1,
    )
    if os.environ.get("COMPOSER_BRIDGE_TEST_PRECISION"):
        options["precision"] = os.environ["COMPOSER_BRIDGE_TEST_PRECISION"]
    options.update(overrides)
    return L.Trainer(**options)


def weights_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every parameter and buffer."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Exactly equal tensors under exactly the same names."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs: max |diff| = {(a[key].float() - b[key].float()).abs().max()}"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    """Nested dicts/lists/tuples of tensors and plain values are exactly equal (names the first difference)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for key in a:
            assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_ddp_script(body: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``body`` (a Python script using ``strategy='ddp', devices=2, accelerator='cpu'``) in a subprocess.

    The script runs with the repository and tests on ``sys.path`` and ``tmp_path`` as cwd;
    returns the completed process (stdout/stderr captured). Lightning launches the second rank.
    """
    script = tmp_path / "ddp_script.py"
    script.write_text(STACKS_ON_SIGUSR1 + textwrap.dedent(body) + END_OF_DDP_SCRIPT)
    return run_ddp_file(script, [], tmp_path, timeout)


def run_ddp_file(
    script: Path, args: list[str], cwd: Path, timeout: float, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the Python file ``script`` with ``args`` as rank 0 of a Lightning launch on this machine.

    The repository and tests are on ``sys.path``; a free port, one thread per process, W&B offline;
    no rank variables inherited from the calling process.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env.setdefault("WANDB_MODE", "offline")
    env["OMP_NUM_THREADS"] = "1"
    env["MASTER_ADDR"] = "127.0.0.1"
    env["MASTER_PORT"] = str(free_port())  # never inherit a port another test still holds
    for inherited in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK", "RANK"):
        env.pop(inherited, None)
    env.update(extra_env or {})
    # its own process group, so that a launch that hangs can be told to show where (both ranks) and be stopped whole
    process = subprocess.Popen([sys.executable, str(script), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = _stop_hung_launch(process)
        raise AssertionError(f"{script.name} (2 processes) did not finish in {timeout:g} s; where each process "
                             f"stood when stopped (stderr, last 8,000 characters):\n{stderr[-8000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


#: the last lines of every script run_ddp_script writes. Once both ranks are here (their files written), each
#: process ends at once, without tearing its gloo process group down: torch 2.6 can deadlock there under load
#: (destroy_process_group joins gloo's worker thread while holding the GIL, and the worker waits for the GIL to
#: free the tensors of its last finished collective; seen in CI on the oldest corner), and left to interpreter
#: shutdown gloo's threads can abort the process ("terminate called without an active exception").
END_OF_DDP_SCRIPT = """
import os as _os, sys as _sys, torch.distributed as _dist
if _dist.is_initialized():
    _dist.barrier()
    _sys.stdout.flush(); _sys.stderr.flush()
    _os._exit(0)
"""

#: the first lines of every script run_ddp_script writes: SIGUSR1 prints every thread's stack to stderr
STACKS_ON_SIGUSR1 = "import faulthandler as _fh, signal as _sig\n_fh.register(_sig.SIGUSR1, all_threads=True)\n"


def _stop_hung_launch(process: subprocess.Popen) -> tuple[str, str]:
    """Ask every process of a hung launch for its stacks (SIGUSR1), then kill them all; their output."""
    import signal

    for sig, wait in ((signal.SIGUSR1, 5.0), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            return process.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return process.communicate()


class ResumableLoader:
    """Fixed batches in order that Lightning can checkpoint mid-epoch (``state_dict``/``load_state_dict``).

    With ``world_size`` > 1 it holds one rank's share of the rows (``rank``, ``rank + world_size``, ...),
    for a script that runs once per rank of a DDP or FSDP launch.

    Example:
        >>> loader = ResumableLoader(image_dataset(n=8), batch_size=2, rank=1, world_size=2)
        >>> len(loader), loader.batches[0][1].tolist() == image_dataset(n=8).tensors[1][[1, 3]].tolist()
        (2, True)
        >>> _ = next(iter(loader)); loader.state_dict()
        {'position': 1}
    """

    def __init__(self, dataset: TensorDataset, batch_size: int, rank: int = 0, world_size: int = 1) -> None:
        x, y = (tensor[rank::world_size] for tensor in dataset.tensors)
        self.batches = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)]
        self.position = 0
        self._resume_at = 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):  # type: ignore[no-untyped-def]
        start, self._resume_at = self._resume_at, 0
        for index in range(start, len(self.batches)):
            self.position = index + 1
            yield self.batches[index]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = int(state["position"]) % len(self.batches)


def _wandb_records(run_file: Path) -> list[Any]:
    """The protobuf records of a ``run-<id>.wandb`` transaction log.

    The log is 32 KiB blocks of chunks, each with a 7-byte header (checksum, length, type:
    1 = whole record, 2/3/4 = first/middle/last piece), after a 7-byte file header.
    """
    from wandb.proto import wandb_internal_pb2

    data, block = run_file.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B", data[:7]
    position, pieces, records = 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # too little room left in the block for a header: padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            break
        pieces += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
    return records


def wandb_run_records(run_file: Path) -> list[Any]:
    """The records of a finished offline W&B run, once wandb has written its ``exit`` record.

    wandb's service may still be writing the file when ``wandb.finish()`` returns (a few seconds at
    most); a read that catches a record half-written is repeated.
    """
    from google.protobuf.message import DecodeError

    for _ in range(200):
        try:
            records = _wandb_records(run_file)
        except DecodeError:
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        time.sleep(0.05)
    raise AssertionError(f"{run_file} has no exit record: the offline run was not finished")
