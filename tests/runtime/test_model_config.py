"""The model's configuration (runtime/model_config.py): a round trip through its dict, and every problem of a bad
one named in one error."""

from __future__ import annotations

import dataclasses
import json

import pytest

from runtime.model_config import ModelConfig


def test_config_rejects_unknown_fields_and_bad_values():
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({"d_model": 8, "n_heads": 2, "colour": "red"})
    with pytest.raises(ValueError, match="not divisible"):
        ModelConfig(d_model=10, n_heads=4)


def test_a_config_round_trips_through_its_dict_as_a_checkpoint_stores_it():
    config = ModelConfig(vocab_size=120, d_model=64, n_heads=8, activation="swish", positions="halves", eos_id=0)
    assert config.d_head == 8
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    defaults = ModelConfig.from_dict({"d_model": 64, "n_heads": 8})  # the fields a dict leaves out
    assert defaults == dataclasses.replace(ModelConfig(), d_model=64, n_heads=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 128


def test_every_problem_is_named_in_one_error():
    with pytest.raises(ValueError) as error:
        ModelConfig(d_model=9, n_heads=2, activation="tanh", norm="middle")
    problems = str(error.value).split("; ")
    assert len(problems) == 4
    assert problems[0].startswith("activation='tanh': use ") and problems[1].startswith("norm='middle': use ")
    assert problems[2] == "d_model=9 is not divisible by n_heads=2"
    assert problems[3] == "d_model=9 must be even for sinusoidal positions"
