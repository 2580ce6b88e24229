from __future__ import annotations

import json

import pytest
import torch

from model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from model.transformer import Transformer


def test_checkpoint_round_trip(tmp_path, trained_tokenizer, tiny_config):
    tokenizer, blob = trained_tokenizer
    torch.manual_seed(0)
    model = Transformer(tiny_config).eval()
    save_checkpoint(tmp_path, model, blob, {"note": "test"})
    loaded, loaded_tokenizer = load_checkpoint(tmp_path)
    assert loaded.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.output.weight.data_ptr() == loaded.embedding.weight.data_ptr(), "tied weights must stay tied"
    assert loaded_tokenizer.encode_source(["a dog runs"]) == tokenizer.encode_source(["a dog runs"])
    assert json.loads((tmp_path / "config.json").read_text())["note"] == "test"


def test_missing_weights_name_the_file(tmp_path, trained_tokenizer, tiny_config):
    save_checkpoint(tmp_path, Transformer(tiny_config), trained_tokenizer[1])
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        load_checkpoint(tmp_path)
