"""The tiny PyTorch model shared by the model tests and the search tests (which decode with it as a reference)."""

from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig
from model.transformer import Transformer


@pytest.fixture
def tiny_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=50, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0
    )


@pytest.fixture
def tiny_model(tiny_config: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config).eval()
