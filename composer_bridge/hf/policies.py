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
=========================  ==============================================  ===========================
"""

from __future__ import annotations

from composer_bridge.algorithms.alibi import register_alibi_policy
from composer_bridge.algorithms.gated_linear_units import register_glu_policy
from composer_bridge.hf.alibi import ALIBI_POLICY
from composer_bridge.hf.feed_forward import GLU_POLICY

__all__ = ["register_hf_policies"]


def register_hf_policies() -> None:
    """Teach ``Alibi`` and ``GatedLinearUnits`` the Hugging Face classes of :data:`ALIBI_POLICY` and :data:`GLU_POLICY`."""
    for cls, fn in ALIBI_POLICY.items():
        register_alibi_policy(cls, fn)
    for cls, fn in GLU_POLICY.items():
        register_glu_policy(cls, fn)
