from __future__ import annotations

import math

import pytest
import torch

from model.positional import sinusoidal_encoding


def paper_formula(pos: int, dim: int, d_model: int) -> float:
    angle = pos / 10000 ** (2 * (dim // 2) / d_model)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


def test_interleaved_matches_the_paper():
    d = 16
    pe = sinusoidal_encoding(torch.arange(50), d)
    expected = torch.tensor([[paper_formula(p, i, d) for i in range(d)] for p in range(50)])
    assert torch.allclose(pe, expected, atol=1e-5)


def test_halves_layout_is_sines_then_cosines():
    d = 16
    pe = sinusoidal_encoding(torch.arange(20), d, "halves")
    interleaved = sinusoidal_encoding(torch.arange(20), d)
    assert torch.allclose(pe[:, : d // 2], interleaved[:, 0::2])
    assert torch.allclose(pe[:, d // 2 :], interleaved[:, 1::2])


@pytest.mark.parametrize("length", [1, 3000])
def test_any_length_and_per_row_positions(length):
    positions = torch.tensor([[0, length - 1], [5, 2]])
    pe = sinusoidal_encoding(positions, 8)
    assert pe.shape == (2, 2, 8)
    assert torch.allclose(pe[1, 0], sinusoidal_encoding(torch.tensor(5), 8))
