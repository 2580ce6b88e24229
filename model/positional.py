"""Sinusoidal positional encoding (Vaswani et al. 2017, section 3.5).

PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

Computed from the positions themselves, so any length works, nothing is
learned, and a decoder step can give every row its own position.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from runtime.model_config import PositionLayout


def sinusoidal_encoding(positions: Tensor, d_model: int, layout: PositionLayout = "interleaved") -> Tensor:
    """Encodings of integer positions (...,) as float32 (..., d_model).

    ``interleaved`` is the paper's layout; ``halves`` is [sin(...) | cos(...)],
    the layout Marian uses. Cosines are computed as sin(x + π/2), so the whole
    encoding is one sine of (position · frequency + phase): a single chain of
    operations that an fp16 export can keep in fp32.
    """
    i = torch.arange(0, d_model // 2, device=positions.device, dtype=torch.float32)
    inv_freq = torch.exp(-math.log(10000.0) * 2.0 * i / d_model)  # (d/2,)
    phase = torch.tensor([0.0, math.pi / 2], device=positions.device)  # sin, cos
    if layout == "halves":
        frequencies, phases = inv_freq.repeat(2), phase.repeat_interleave(d_model // 2)
    else:
        frequencies, phases = inv_freq.repeat_interleave(2), phase.repeat(d_model // 2)  # (d,)
    return torch.sin(positions.to(torch.float32).unsqueeze(-1) * frequencies + phases)  # (..., d)
