"""examples/hf_gpt2.py runs (its --quick smoke configuration) and exports a model that loads back."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file

from composer_bridge.functional import apply_alibi, apply_gated_linear_units

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_hf_gpt2_example_trains_with_the_recipe_and_exports(tmp_path):
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # as when run as a script: it reuses examples/language.py's text
    spec = importlib.util.spec_from_file_location("example_hf_gpt2", EXAMPLES / "hf_gpt2.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.__doc__.startswith("Hugging Face example") and "python examples/hf_gpt2.py" in example.__doc__

    metrics = example.main(["--quick", "--no-wandb", "--out", str(tmp_path), "--accelerator", "cpu"])
    assert math.isfinite(metrics["val/loss"]) and metrics["val/loss"] < math.log(128) + 1.0
    assert 0.0 <= metrics["val/acc"] <= 1.0

    export = tmp_path / "hf_gpt2"
    config = transformers.AutoConfig.from_pretrained(export)
    model = transformers.GPT2LMHeadModel(config)
    apply_alibi(model, max_sequence_length=config.n_positions)
    apply_gated_linear_units(model)
    missing, unexpected = model.load_state_dict(load_file(export / "model.safetensors"), strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}
    assert not bool(model.transformer.wpe.weight.any())
    with torch.no_grad():
        assert model(torch.randint(0, 128, (1, 16))).logits.shape == (1, 16, 128)
