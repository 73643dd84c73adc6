"""A small ResNet-style CNN, sized for 8x8 digits but working on any image size.

Examples:
    >>> import torch
    >>> net = ResNetCNN(num_classes=10, in_channels=1)
    >>> net(torch.randn(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    >>> net(torch.randn(2, 1, 13, 9)).shape  # any size: global pooling at the end
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock", "ResNetCNN"]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or 1x1 projection) shortcut.

    ``residual(x)`` is the branch without the shortcut, so stochastic depth can drop it.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.residual(x) + self.shortcut(x))


class ResNetCNN(nn.Module):
    """Stem convolution, ``len(widths)`` stages of ``blocks_per_stage`` :class:`BasicBlock`, global pool, linear.

    Args:
        num_classes: outputs of the final linear layer.
        in_channels: image channels (1 for digits).
        widths: channels per stage; each stage after the first halves the resolution.
        blocks_per_stage: residual blocks in each stage.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        widths: tuple[int, ...] = (32, 64),
        blocks_per_stage: int = 2,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        stages = []
        channels = widths[0]
        for i, width in enumerate(widths):
            for j in range(blocks_per_stage):
                stages.append(BasicBlock(channels, width, stride=2 if (i > 0 and j == 0) else 1))
                channels = width
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))
