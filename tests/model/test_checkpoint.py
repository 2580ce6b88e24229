from __future__ import annotations

import json

import pytest
import torch

from model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from model.transformer import Transformer
from runtime.model_config import ModelConfig
from runtime.tokenizer import Tokenizer

TEXTS = ["a man rides a horse", "zwei hunde spielen im schnee", "a dog runs", "ein mann fährt fahrrad"] * 50


@pytest.fixture(scope="module")
def trained_tokenizer() -> tuple[Tokenizer, bytes]:
    return Tokenizer.train(TEXTS, vocab_size=40)


def test_tokenizer_round_trip(trained_tokenizer):
    tokenizer, _ = trained_tokenizer
    ids = tokenizer.encode_source(["a man rides a horse", "zwei hunde"])
    assert all(isinstance(i, int) for row in ids for i in row)
    assert tokenizer.decode(ids) == ["a man rides a horse", "zwei hunde"]
    special = tokenizer.special_ids
    assert (special.pad, special.unk, special.bos, special.eos) == (0, 1, 2, 3)


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


def test_config_rejects_unknown_fields_and_bad_values():
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({"d_model": 8, "n_heads": 2, "colour": "red"})
    with pytest.raises(ValueError, match="not divisible"):
        ModelConfig(d_model=10, n_heads=4)
