"""Registration of the Hugging Face surgery policies with the library's algorithms.

``import composer_bridge.hf`` calls :func:`register_hf_policies` once; calling it again changes
nothing (a registered class is replaced by itself). The algorithms never import ``transformers``:
they hold what was registered, and ``Alibi``/``GatedLinearUnits`` import ``composer_bridge.hf``
themselves when the model they change holds a class from ``transformers`` (told by its module
name, see ``composer_bridge.algorithms._library_policies``), so users need not import it first.

=========================  ==============================================  ===========================
algorithm                  Hugging Face classes                            how
=========================  ==============================================  ===========================
Alibi                      ``GPT2Model``, ``BertModel``                     position embedding zeroed,
                                                                           frozen, resized
Alibi                      ``GPT2Attention``, ``BertSelfAttention``,        ALiBi bias added to the
                           ``LlamaAttention``                               attention mask (in place)
GatedLinearUnits           ``BertIntermediate``, ``GPT2MLP``               gated projection (in place)
LowPrecisionLayerNorm      ``nn.LayerNorm`` (GPT-2, BERT): nothing to add  (Llama's RMSNorm: not handled)
Factorize                  ``nn.Linear`` (BERT, Llama): nothing to add      GPT-2: :func:`conv1d_to_linear` first
QKNorm                     ``GPT2Attention``, ``LlamaAttention``,           per-head RMSNorm on the
                           ``Qwen2Attention``, ``MistralAttention``,        query/key projections
                           ``GemmaAttention``, ``Phi3Attention``,           (in place, see
                           ``GPTNeoXAttention``                             :mod:`composer_bridge.hf.qk_norm`)
=========================  ==============================================  ===========================
"""

from __future__ import annotations

from composer_bridge.algorithms.alibi import register_alibi_policy
from composer_bridge.algorithms.gated_linear_units import register_glu_policy
from composer_bridge.algorithms.qk_norm import register_qk_norm_policy
from composer_bridge.hf.alibi import ALIBI_POLICY
from composer_bridge.hf.feed_forward import GLU_POLICY
from composer_bridge.hf.qk_norm import QK_NORM_POLICY

__all__ = ["register_hf_policies"]


def register_hf_policies() -> None:
    """Teach ``Alibi``, ``GatedLinearUnits`` and ``QKNorm`` the Hugging Face classes of their policies."""
    for cls, fn in ALIBI_POLICY.items():
        register_alibi_policy(cls, fn)
    for cls, fn in GLU_POLICY.items():
        register_glu_policy(cls, fn)
    for cls, fn in QK_NORM_POLICY.items():
        register_qk_norm_policy(cls, fn)
