"""Self-describing checkpoints: one folder, no pickles.

DIR/config.json          {"format_revision", "model": ModelConfig, "tokenizer", ...}
DIR/model.safetensors    weights
DIR/sentencepiece.model  the joint tokenizer (or source.spm + target.spm + vocab.json)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_model

from model.config import ModelConfig
from model.tokenizer import Tokenizer
from model.transformer import Transformer

FORMAT_REVISION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SPM_FILE = "sentencepiece.model"
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "default"


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message says which file and why."""


def save_checkpoint(
    directory: str | Path, model: Transformer, spm_model: bytes, metadata: dict[str, Any] | None = None
) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_model(model, str(directory / WEIGHTS_FILE))
    (directory / SPM_FILE).write_bytes(spm_model)
    config = {"format_revision": FORMAT_REVISION, "model": model.config.to_dict(), **(metadata or {})}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return directory


def read_config(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG_FILE
    if not path.exists():
        raise CheckpointError(f"{path} is missing: not a checkpoint folder")
    config = json.loads(path.read_text())
    revision = config.get("format_revision")
    if revision != FORMAT_REVISION:
        raise CheckpointError(f"{path} has format_revision {revision}; this code reads revision {FORMAT_REVISION}")
    return config


def load_tokenizer(directory: str | Path) -> Tokenizer:
    path = Path(directory) / SPM_FILE
    if not path.exists():
        raise CheckpointError(f"{path} is missing")
    return Tokenizer.from_file(path)


def load_checkpoint(directory: str | Path = DEFAULT_CHECKPOINT, device: str = "cpu") -> tuple[Transformer, Tokenizer]:
    """The model (in eval mode) and tokenizer of a checkpoint folder."""
    directory = Path(directory)
    config = ModelConfig.from_dict(read_config(directory)["model"])
    model = Transformer(config)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.exists():
        raise CheckpointError(f"{weights_path} is missing")
    state = load_file(str(weights_path), device=device)
    if config.tie_output:
        state.setdefault("output.weight", state.get("embedding.weight"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{weights_path}: missing {missing}, unexpected {unexpected}")
    return model.to(device).eval(), load_tokenizer(directory)


def average_weights(directories: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the weights of several checkpoints of one model."""
    total: dict[str, torch.Tensor] = {}
    for d in directories:
        for name, tensor in load_file(str(d / WEIGHTS_FILE)).items():
            total[name] = total.get(name, 0) + tensor.double()
    return {name: (t / len(directories)).float() for name, t in total.items()}
