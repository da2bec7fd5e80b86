"""A small ViT-like classifier the formulas do not know: for `trainmem trace --module` tests.

Patches of 16 x 16 pixels in one row (seq_len patches), a class token, pre-norm blocks of
multi-head attention (torch's scaled_dot_product_attention) and a GELU MLP, a linear head.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

PATCH = 16


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyViT(nn.Module):
    def __init__(self, hidden: int = 128, heads: int = 4, layers: int = 3, classes: int = 10):
        super().__init__()
        self.patch = nn.Conv2d(3, hidden, kernel_size=PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def factory(seq_len: int = 64, micro_batch_size: int = 2):
    """(model, (images,), loss_fn): seq_len patches of 16 x 16 in one row, a class label each."""
    model = TinyViT()
    images = torch.randn(micro_batch_size, 3, PATCH, PATCH * seq_len)
    labels = torch.randint(0, 10, (micro_batch_size,))

    def loss_fn(logits: torch.Tensor, batch: tuple[torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels)

    return model, (images,), loss_fn


def tensor_factory():
    """(model, images): no loss_fn, so trainmem reduces the logits with .float().mean()."""
    return TinyViT(), torch.randn(2, 3, PATCH, PATCH * 8)


def not_a_module():
    return "nope", None


def vit_b16_factory(seq_len: int = 196, micro_batch_size: int = 2):
    """ViT-B/16 sizes (hidden 768, 12 heads, 12 blocks, 1000 classes): the shipped traced profile
    tests/data/profiles/vit-b16-traced.json comes from this factory."""
    model = TinyViT(hidden=768, heads=12, layers=12, classes=1000)
    images = torch.randn(micro_batch_size, 3, PATCH, PATCH * seq_len)
    labels = torch.randint(0, 1000, (micro_batch_size,))

    def loss_fn(logits: torch.Tensor, batch: tuple[torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels)

    return model, (images,), loss_fn
