"""Sinusoidal positional encoding (Vaswani et al. 2017, section 3.5).

PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

Computed from the positions themselves, so any length works, nothing is
learned, and a decoder step can give every row its own position.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from model.config import PositionLayout


def sinusoidal_encoding(positions: Tensor, d_model: int, layout: PositionLayout = "interleaved") -> Tensor:
    """Encodings of integer positions (...,) as float32 (..., d_model).

    ``interleaved`` is the paper's layout; ``halves`` is [sin(...) | cos(...)],
    the layout Marian uses.
    """
    i = torch.arange(0, d_model // 2, device=positions.device, dtype=torch.float32)
    inv_freq = torch.exp(-math.log(10000.0) * 2.0 * i / d_model)  # (d/2,)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # (..., d/2)
    sin, cos = torch.sin(angles), torch.cos(angles)
    if layout == "halves":
        return torch.cat([sin, cos], dim=-1)
    return torch.stack([sin, cos], dim=-1).flatten(-2)  # (..., d/2, 2) -> (..., d)
