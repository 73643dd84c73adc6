"""Both Lightning packages in one process: ``lightning.pytorch`` and ``pytorch_lightning``, chosen by the objects given.

The oracle for the ``pytorch_lightning`` side is the same run on ``lightning.pytorch``: the two
packages have the same code, so a run must end with exactly the same weights and fire exactly the
same events on either. (CI also runs the Lightning-facing test files on ``pytorch_lightning`` with
``COMPOSER_BRIDGE_TEST_LIGHTNING=pytorch_lightning``; this file needs both at once.)
"""

from __future__ import annotations

import ast
import doctest
import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning.pytorch
import pytest
import pytorch_lightning
import torch
import torch.nn.functional as F
from helpers.support import REPO, assert_same_weights, image_loader, weights_of
from helpers.two_processes import saved_by_each_rank

import composer_bridge
import composer_bridge.pl
from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State
from composer_bridge.algorithms import EMA, GradientClipping, LabelSmoothing, MixUp
from composer_bridge.lightning import BridgeConfigurationError
from composer_bridge.lightning.module import ComposerClassifierMixin, ComposerModuleMixin
from composer_bridge.lightning.package import LIGHTNING, PYTORCH_LIGHTNING, package_of
from composer_bridge.lightning.setup_checks import check_one_package

PACKAGES = {"lightning.pytorch": lightning.pytorch, "pytorch_lightning": pytorch_lightning}
FLAVOURS = {"lightning.pytorch": composer_bridge, "pytorch_lightning": composer_bridge.pl}


class Recorder(Algorithm):
    """Records every event it sees (matching all), and the batch's first value at AFTER_DATALOADER."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def match(self, event: Event, state: State) -> bool:
        return True

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.events.append(event.name)


def plain_module(package: ModuleType) -> Any:
    """The LightningModule a new user writes: loss inside training_step, a validation_step."""

    class Plain(package.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", F.cross_entropy(self(x), y))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.5)

    return Plain()


def trainer_of(package: ModuleType, **overrides: Any) -> Any:
    options: dict[str, Any] = dict(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, max_epochs=1,
    )
    options.update(overrides)
    return package.Trainer(**options)


def fit_plain(name: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    recorder = Recorder()
    callback = AlgorithmEngineCallback([EMA(half_life="2ba"), GradientClipping("norm", 0.05), recorder], seed=0)
    module = plain_module(PACKAGES[name])
    trainer_of(PACKAGES[name], max_steps=4, limit_val_batches=2, val_check_interval=2, callbacks=[callback]).fit(
        module, image_loader(n=64, batch_size=8), image_loader(n=16, batch_size=8))
    return weights_of(module), recorder.events


def test_a_plain_pytorch_lightning_module_trains_with_the_callback_exactly_as_on_lightning() -> None:
    """The first thing a ``pl`` user tries: ``pl.Trainer(callbacks=[AlgorithmEngineCallback([...])]).fit(MyModule())``."""
    pl_weights, pl_events = fit_plain("pytorch_lightning")
    lightning_weights, lightning_events = fit_plain("lightning.pytorch")
    assert_same_weights(pl_weights, lightning_weights)
    assert pl_events == lightning_events
    # every step's data, backward, clipping and eval events: the Trainer's stage is read from its own package
    for event in ("AFTER_DATALOADER", "BEFORE_BACKWARD", "AFTER_TRAIN_BATCH", "EVAL_BEFORE_FORWARD", "EVAL_END"):
        assert event in pl_events, event
    assert pl_events.count("AFTER_DATALOADER") == 4


def fit_plain_with_loss_algorithms(name: str) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    class Criterion(PACKAGES[name].LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4))
            self.criterion = torch.nn.CrossEntropyLoss()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return self.criterion(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.5)

    module = Criterion()
    callback = AlgorithmEngineCallback([LabelSmoothing(0.1), MixUp(alpha=0.4)], seed=3)
    trainer_of(PACKAGES[name], max_steps=3, callbacks=[callback]).fit(module, image_loader(n=48, batch_size=8))
    return weights_of(module), {key: stats.count for key, stats in callback.traces.stats.items()}


def test_loss_algorithms_on_a_plain_pytorch_lightning_module_act_exactly_as_on_lightning() -> None:
    pl_weights, pl_counts = fit_plain_with_loss_algorithms("pytorch_lightning")
    lightning_weights, lightning_counts = fit_plain_with_loss_algorithms("lightning.pytorch")
    assert pl_counts == lightning_counts and pl_counts["LabelSmoothing/BEFORE_LOSS"] == 3
    assert_same_weights(pl_weights, lightning_weights)


def fit_classifier(name: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4))
    model = FLAVOURS[name].ComposerClassifier(net, num_classes=4, optimizer=lambda p: torch.optim.SGD(p, lr=0.5))
    callback = AlgorithmEngineCallback([LabelSmoothing(0.1), MixUp(alpha=0.4)], seed=3)
    trainer_of(PACKAGES[name], max_steps=3, callbacks=[callback]).fit(model, image_loader(n=48, batch_size=8))
    assert callback.traces.stats["MixUp/BEFORE_FORWARD"].count == 3
    return weights_of(model)


def test_composer_classifier_of_each_flavour_trains_identically_with_loss_algorithms() -> None:
    assert_same_weights(fit_classifier("pytorch_lightning"), fit_classifier("lightning.pytorch"))


def test_the_callback_is_a_callback_of_both_packages_and_each_flavour_a_module_of_its_own() -> None:
    callback = AlgorithmEngineCallback([EMA()])
    assert isinstance(callback, lightning.pytorch.Callback) and isinstance(callback, pytorch_lightning.Callback)
    assert composer_bridge.pl.AlgorithmEngineCallback is AlgorithmEngineCallback
    net = torch.nn.Linear(4, 2)
    pl_model, lightning_model = composer_bridge.pl.ComposerClassifier(net, 2), composer_bridge.ComposerClassifier(net, 2)
    assert isinstance(pl_model, pytorch_lightning.LightningModule)
    assert not isinstance(pl_model, lightning.pytorch.LightningModule)
    assert isinstance(lightning_model, lightning.pytorch.LightningModule)
    assert not isinstance(lightning_model, pytorch_lightning.LightningModule)
    for model in (pl_model, lightning_model):
        assert isinstance(model, ComposerClassifierMixin) and isinstance(model, ComposerModuleMixin)
    assert package_of(pl_model) is PYTORCH_LIGHTNING and package_of(lightning_model) is LIGHTNING
    # one body of code: the flavours add nothing of their own
    assert set(vars(composer_bridge.pl.ComposerClassifier)) <= {"__module__", "__doc__", "__qualname__",
                                                                "__firstlineno__", "__static_attributes__"}


@pytest.mark.parametrize("trainer_package, module_package", [("pytorch_lightning", "lightning.pytorch"),
                                                             ("lightning.pytorch", "pytorch_lightning")])
def test_a_module_of_the_other_package_is_refused_naming_both(trainer_package: str, module_package: str) -> None:
    trainer = trainer_of(PACKAGES[trainer_package])
    net = torch.nn.Linear(4, 2)
    module = FLAVOURS[module_package].ComposerClassifier(net, 2)
    with pytest.raises(BridgeConfigurationError) as error:
        check_one_package(trainer, module)
    message = str(error.value)
    assert f"{trainer_package}.Trainer" in message and f"is a {module_package} object" in message
    assert "Fix:" in message and ("composer_bridge.pl.ComposerModule" in message) == (trainer_package == "pytorch_lightning")
    # Lightning itself refuses the mix at fit, before the bridge (or anything) runs
    callback = AlgorithmEngineCallback([EMA()])
    with pytest.raises(TypeError, match="must be a `LightningModule`"):
        trainer_of(PACKAGES[trainer_package], callbacks=[callback]).fit(module, image_loader(n=8, batch_size=8))
    assert callback.state is None


def test_a_datamodule_of_the_other_package_is_refused_naming_both() -> None:
    trainer = trainer_of(pytorch_lightning)
    trainer.datamodule = lightning.pytorch.LightningDataModule()  # what Trainer.fit(datamodule=...) sets
    with pytest.raises(BridgeConfigurationError, match=r"DataModule \(LightningDataModule\) is a lightning.pytorch"):
        check_one_package(trainer, plain_module(pytorch_lightning))


def test_callbacks_and_loggers_of_the_other_package_are_recognised_as_lightning_accepts_them(tmp_path: Path) -> None:
    """``pl.Trainer`` trains with ``lightning``'s SWA callback or W&B logger; the bridge's checks see them too."""
    swa = lightning.pytorch.callbacks.StochasticWeightAveraging(swa_lrs=0.1)
    trainer = trainer_of(pytorch_lightning, callbacks=[AlgorithmEngineCallback([EMA()]), swa])
    with pytest.raises(BridgeConfigurationError, match="StochasticWeightAveraging"):
        trainer.fit(plain_module(pytorch_lightning), image_loader(n=8, batch_size=8))
    from composer_bridge.lightning.wandb_report import wandb_loggers

    loggers = [lightning.pytorch.loggers.WandbLogger(save_dir=str(tmp_path), offline=True),
               pytorch_lightning.loggers.WandbLogger(save_dir=str(tmp_path), offline=True)]
    assert wandb_loggers(trainer_of(pytorch_lightning, logger=loggers)) == loggers


def test_pytorch_lightnings_cli_takes_the_callback_from_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``pytorch_lightning.cli.LightningCLI`` checks ``trainer.callbacks`` against ``list[pl.Callback]``."""
    cli_module = pytest.importorskip("pytorch_lightning.cli")  # needs jsonargparse
    monkeypatch.chdir(tmp_path)
    callbacks = json.dumps([{
        "class_path": "composer_bridge.AlgorithmEngineCallback",
        "init_args": {"algorithms": [{"class_path": "composer_bridge.algorithms.LabelSmoothing",
                                      "init_args": {"smoothing": 0.2}}], "seed": 5},
    }])
    cli = cli_module.LightningCLI(
        PlClassifier, PlData, seed_everything_default=0, run=False, save_config_kwargs={"overwrite": True},
        args=["--trainer.max_steps=2", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
              "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu", "--trainer.devices=1",
              f"--trainer.callbacks={callbacks}"])
    (bridge,) = [c for c in cli.trainer.callbacks if isinstance(c, AlgorithmEngineCallback)]
    assert bridge.algorithms == [LabelSmoothing(smoothing=0.2)] and bridge.seed == 5
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert bridge.traces.stats["LabelSmoothing/BEFORE_LOSS"].count == 2

    pytorch_lightning.seed_everything(0)
    model = PlClassifier()
    trainer_of(pytorch_lightning, max_steps=2, callbacks=[AlgorithmEngineCallback([LabelSmoothing(0.2)], seed=5)]).fit(
        model, datamodule=PlData())
    assert_same_weights(weights_of(cli.model), weights_of(model))


class PlClassifier(composer_bridge.pl.ComposerClassifier):
    def __init__(self, lr: float = 0.2) -> None:
        super().__init__(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4)), num_classes=4,
                         optimizer=lambda p: torch.optim.SGD(p, lr=lr))


class PlData(pytorch_lightning.LightningDataModule):
    def train_dataloader(self) -> Any:
        return image_loader(n=32, batch_size=8)


def test_hugging_face_model_of_each_flavour_trains_identically() -> None:
    transformers = pytest.importorskip("transformers")
    from composer_bridge.hf import HuggingFaceModel

    assert issubclass(composer_bridge.pl.HuggingFaceModel, pytorch_lightning.LightningModule)
    weights = []
    for name, cls in (("pytorch_lightning", composer_bridge.pl.HuggingFaceModel), ("lightning.pytorch", HuggingFaceModel)):
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
        model = cls(transformers.GPT2LMHeadModel(config))
        ids = torch.randint(0, 32, (8, 8), generator=torch.Generator().manual_seed(1))
        loader = torch.utils.data.DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=4)
        callback = AlgorithmEngineCallback([LabelSmoothing(0.1, target_key="labels")])
        trainer_of(PACKAGES[name], max_steps=2, callbacks=[callback]).fit(model, loader)
        assert callback.traces.stats["LabelSmoothing/BEFORE_LOSS"].count == 2
        weights.append(weights_of(model))
    assert_same_weights(*weights)


DDP_SCRIPT = """
import torch, pytorch_lightning as pl
from helpers.support import image_loader
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import EMA, LabelSmoothing
from composer_bridge.pl import ComposerClassifier

pl.seed_everything(0)
model = ComposerClassifier(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4)), num_classes=4)
callback = AlgorithmEngineCallback([LabelSmoothing(0.1), EMA(half_life="2ba")])
trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=2, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
trainer.fit(model, image_loader(n=32, batch_size=8))
torch.save({"weights": {k: v.detach() for k, v in model.named_parameters()},
            "steps": int(callback.state.timestamp.batch), "smoothed": callback.traces.stats["LabelSmoothing/BEFORE_LOSS"].count},
           f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_on_two_processes_with_pytorch_lightning_ends_identical(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    assert [r["steps"] for r in ranks] == [2, 2] and [r["smoothed"] for r in ranks] == [2, 2]
    assert_same_weights(ranks[0]["weights"], ranks[1]["weights"])


def _runtime_lightning_imports(path: Path) -> list[str]:
    """``import lightning...``/``pytorch_lightning...`` statements outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    guarded = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
               and "TYPE_CHECKING" in ast.unparse(block.test) for node in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning")]
    return found


def test_only_package_py_imports_a_lightning_package_by_name() -> None:
    """Everywhere in the library, the recipe search included (it builds the Trainer of the module's package)."""
    sources = sorted((REPO / "composer_bridge").rglob("*.py"))
    found = [hit for path in sources if path.name != "package.py" for hit in _runtime_lightning_imports(path)]
    assert found == []
    assert _runtime_lightning_imports(REPO / "composer_bridge" / "lightning" / "package.py") == []  # importlib, by name


@pytest.mark.parametrize("name", ["composer_bridge.lightning.package", "composer_bridge.lightning.setup_checks",
                                  "composer_bridge.lightning.module", "composer_bridge.pl"])
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
