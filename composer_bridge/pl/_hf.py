"""``composer_bridge.pl.HuggingFaceModel``: :class:`~composer_bridge.hf.HuggingFaceModel` on ``pytorch_lightning``."""

from __future__ import annotations

from composer_bridge.hf.module import HuggingFaceModelMixin
from composer_bridge.pl import ComposerModule

__all__ = ["HuggingFaceModel"]


class HuggingFaceModel(HuggingFaceModelMixin, ComposerModule):
    """``composer_bridge.hf.HuggingFaceModel`` as a ``pytorch_lightning.LightningModule`` (same arguments).

    Examples:
        >>> import transformers, pytorch_lightning as pl
        >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
        >>> isinstance(HuggingFaceModel(transformers.GPT2LMHeadModel(config)), pl.LightningModule)
        True
    """
