"""Small reference models the examples, tests and benchmarks train (and the surgery algorithms know)."""

from composer_bridge.models.gpt import GPT, CausalSelfAttention, FeedForward, TransformerBlock
from composer_bridge.models.resnet import BasicBlock, ResNetCNN

__all__ = ["GPT", "BasicBlock", "CausalSelfAttention", "FeedForward", "ResNetCNN", "TransformerBlock"]
