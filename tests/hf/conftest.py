"""Tiny Hugging Face models built from configs (no download); tests/hf is skipped without transformers."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("transformers") is None:  # pragma: no cover - the dev extra installs it
    collect_ignore_glob = ["test_*.py"]
else:
    import torch
    import transformers

    VOCAB = 64

    def _gpt2(**overrides):
        options = dict(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
                       embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        options.update(overrides)
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(**options))

    def _bert_config(**overrides):
        options = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                       vocab_size=VOCAB, max_position_embeddings=64, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
        options.update(overrides)
        return transformers.BertConfig(**options)

    def _bert(**overrides):
        torch.manual_seed(0)
        return transformers.BertForMaskedLM(_bert_config(**overrides))

    def _llama(**overrides):
        options = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                       intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                       eos_token_id=0)
        options.update(overrides)
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**options))

    @pytest.fixture
    def gpt2():
        """``gpt2(**config_overrides)``: a 2-layer GPT-2 LM, dropout off."""
        return _gpt2

    @pytest.fixture
    def bert():
        """``bert(**config_overrides)``: a 2-layer BERT masked LM, dropout off."""
        return _bert

    @pytest.fixture
    def bert_config():
        return _bert_config

    @pytest.fixture
    def llama():
        """``llama(**config_overrides)``: a 2-layer Llama causal LM."""
        return _llama
