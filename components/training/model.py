"""Model factory: a small CNN and torchvision's ResNet-18 / Wide ResNet-101-2 adapted to the data's shape.

``wide_resnet101_2`` (Zagoruyko & Komodakis 2016; torchvision) has 126.9 M parameters: with SGD
momentum its checkpoint holds about 1.0 GB (fp32), the large-checkpoint case of
``benchmarks/checkpoint_overhead.py``.

Input of every model: float32 (N, C, H, W) normalized images; output: logits (N, num_classes).
"""

from __future__ import annotations

import torch
from torch import nn

MODEL_NAMES = ("small_cnn", "resnet18", "wide_resnet101_2")


class SmallCNN(nn.Module):
    """Two 3x3 conv blocks (32, 64 channels) + adaptive 4x4 pool + 2-layer MLP with dropout 0.25.

    About 0.3 M parameters for 10 classes; works for any input size >= 4x4.
    """

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.AdaptiveAvgPool2d(4),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, 128),
            nn.ReLU(inplace=True),
            nn.Dropout(0.25),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def resnet18(in_channels: int, num_classes: int, image_size: tuple[int, int], *,
             variant: str = "resnet18") -> nn.Module:
    """torchvision ResNet-18 (He et al., 2016), or another torchvision ResNet ``variant``. For small
    images (< 64 px) the 7x7/2 stem and max-pool are replaced by a 3x3/1 convolution, the usual CIFAR
    adaptation; ``in_channels`` may differ from 3."""
    import torchvision.models

    model = getattr(torchvision.models, variant)(weights=None, num_classes=num_classes)
    if min(image_size) < 64:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def build_model(name: str, *, in_channels: int, num_classes: int, image_size: tuple[int, int]) -> nn.Module:
    """Build a model by name.

    Raises:
        ValueError: unknown name.
    """
    if name == "small_cnn":
        return SmallCNN(in_channels, num_classes)
    if name in ("resnet18", "wide_resnet101_2"):
        return resnet18(in_channels, num_classes, image_size, variant=name)
    raise ValueError(f"unknown model {name!r}; choose one of {MODEL_NAMES}")
