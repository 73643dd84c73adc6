"""Hugging Face ``transformers`` models in composer_bridge (``pip install composer-bridge[hf]``).

- :class:`HuggingFaceModel`: a :class:`~composer_bridge.ComposerModule` around any
  ``PreTrainedModel`` (causal LM, masked LM, sequence classification) with Hugging Face batches.
- Surgery policies for Hugging Face classes. Importing this package registers them with the
  library's algorithms (through :func:`~composer_bridge.algorithms.alibi.register_alibi_policy` and
  :func:`~composer_bridge.algorithms.gated_linear_units.register_glu_policy`); ``Alibi`` and
  ``GatedLinearUnits`` (functional forms, classes, recipes) import it by themselves when the model
  they change holds ``transformers`` classes, so ``apply_alibi(gpt2, ...)`` needs no import of it
  first. ``composer_bridge`` never imports ``transformers`` for a model that holds none, and this
  package imports Lightning only when ``HuggingFaceModel`` is first used.
- :func:`conv1d_to_linear`: GPT-2's ``Conv1D`` layers as ``nn.Linear``, for ``Factorize``.

Examples:
    >>> import transformers
    >>> from composer_bridge import AlgorithmEngineCallback, recipes
    >>> from composer_bridge.hf import HuggingFaceModel
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
    >>> module = HuggingFaceModel(transformers.GPT2LMHeadModel(config))
    >>> callback = AlgorithmEngineCallback(recipes.language("gpt-fast", max_seq_length=16))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import transformers  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "composer_bridge.hf needs Hugging Face transformers: pip install 'composer-bridge[hf]' "
        "(or pip install transformers)."
    ) from error

from composer_bridge.hf.alibi import (
    ALIBI_POLICY,
    AlibiAttention,
    AlibiBertSelfAttention,
    AlibiGPT2Attention,
    AlibiLlamaAttention,
    alibi_attention_mask,
    to_alibi,
)
from composer_bridge.hf.conv1d import Conv1DLinear, conv1d_to_linear, linear_to_conv1d
from composer_bridge.hf.feed_forward import GLU_POLICY
from composer_bridge.hf.policies import register_hf_policies

if TYPE_CHECKING:
    from composer_bridge.hf.module import IGNORE_INDEX, HuggingFaceModel, infer_task

__all__ = [
    "ALIBI_POLICY",
    "GLU_POLICY",
    "IGNORE_INDEX",
    "AlibiAttention",
    "AlibiBertSelfAttention",
    "AlibiGPT2Attention",
    "AlibiLlamaAttention",
    "Conv1DLinear",
    "HuggingFaceModel",
    "alibi_attention_mask",
    "conv1d_to_linear",
    "infer_task",
    "linear_to_conv1d",
    "register_hf_policies",
    "to_alibi",
]

# HuggingFaceModel is a ComposerModule, so it brings in Lightning; the surgeries import this package by
# themselves when a model holds transformers classes, and must not load Lightning with it.
_MODULE_NAMES = {"IGNORE_INDEX", "HuggingFaceModel", "infer_task"}


def __getattr__(name: str) -> Any:
    if name in _MODULE_NAMES:
        from composer_bridge.hf import module

        return getattr(module, name)
    raise AttributeError(f"module 'composer_bridge.hf' has no attribute {name!r}")


register_hf_policies()
