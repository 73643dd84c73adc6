"""A small vision transformer on the cluttered 16x16 digits: the timm-style ViT workload.

The model is written the way the timm / ViT community writes it: a ``Conv2d`` patch embedding (4x4
patches, 16 tokens), a class token and learned position embeddings, pre-norm blocks whose
``Attention`` holds one fused ``qkv`` Linear and a ``proj`` Linear, an ``Mlp`` of two Linears with
GELU, a final LayerNorm and a Linear head on the class token. The data is
:func:`composer_bridge.data.cluttered_digits_datasets` at 16x16 with pixel noise 0.1 (1,800 training
images, 1,197 validation images, 10 classes), the same for every seed. Quality is validation accuracy.

Calibration (one CPU thread, ``time.process_time``, batch 64, seed 0): at the cluttered-digits ResNet's
noise (0.35) the ViT plateaus near 0.21 accuracy by 400 steps (validation loss rising: it memorises the
1,800 noisy images), too low to compare methods; with pixel noise 0.1 it reaches 0.47 at 600 steps.
B = 600 steps, about 14 s of training; the learning rate is chosen from ``lr_grid`` on the tuning seeds
(at the higher noise and 400 steps: 3e-4 -> 0.19, 1e-3 -> 0.21, 3e-3 -> 0.21, 1e-2 -> 0.15).

Examples:
    from workloads.vit import WORKLOAD
    train_loader, val_loader = WORKLOAD.make_data(0)
    module = WORKLOAD.make_module(WORKLOAD.budget_steps, WORKLOAD.lr_grid[1])
"""

from __future__ import annotations

import functools

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from workloads.base import Workload, adamw_warmup_cosine, seeded_loaders

BATCH_SIZE = 64


class PatchEmbed(nn.Module):
    """Image to patch tokens with one strided convolution."""

    def __init__(self, img_size: int = 16, patch_size: int = 4, in_chans: int = 1, embed_dim: int = 64):
        super().__init__()
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, C)


class Attention(nn.Module):
    """Multi-head self-attention with one fused ``qkv`` projection."""

    def __init__(self, dim: int, num_heads: int = 4, qkv_bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(x)


class Mlp(nn.Module):
    """Two Linears with GELU between them."""

    def __init__(self, in_features: int, hidden_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 2.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """A small ViT: patch embedding, class token, position embeddings, blocks, norm, head."""

    def __init__(self, img_size: int = 16, patch_size: int = 4, in_chans: int = 1, num_classes: int = 10,
                 embed_dim: int = 64, depth: int = 4, num_heads: int = 4, mlp_ratio: float = 2.0):
        super().__init__()
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, embed_dim))
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


class ViTModule(L.LightningModule):
    """The ViT trained with cross-entropy and the benchmark's AdamW schedule."""

    def __init__(self, total_steps: int, lr: float):
        super().__init__()
        self.total_steps = total_steps
        self.lr = lr
        self.model = VisionTransformer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, batch_size=len(y))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y), batch_size=len(y))
        self.log("val/acc", (logits.argmax(-1) == y).float().mean(), batch_size=len(y))

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.parameters(), self.lr, self.total_steps)


@functools.lru_cache(maxsize=1)
def _datasets() -> tuple[TensorDataset, TensorDataset]:
    from composer_bridge.data import cluttered_digits_datasets

    return cluttered_digits_datasets(image_size=16, copies=3, train_per_class=60, noise=0.1, seed=0)


def make_module(total_steps: int, lr: float) -> ViTModule:
    return ViTModule(total_steps, lr)


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    return seeded_loaders(*_datasets(), batch_size=BATCH_SIZE, seed=seed)


WORKLOAD = Workload(
    name="vit",
    description="ViT (4x4 patches, dim 64, depth 4) on cluttered 16x16 digits, pixel noise 0.1",
    make_module=make_module,
    make_data=make_data,
    monitor="val/acc",
    mode="max",
    budget_steps=600,
    lr_grid=(3e-4, 1e-3, 3e-3),
    requires=(),
)
