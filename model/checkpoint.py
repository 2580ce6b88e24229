"""Self-describing checkpoints: one folder, no pickles.

DIR/config.json          {"format_revision", "model": ModelConfig, "tokenizer": {"kind", "files"}, ...}
DIR/model.safetensors    weights
DIR/sentencepiece.model  the joint tokenizer (kind "joint"), or
DIR/source.spm, target.spm, vocab.json  two models mapped through a shared vocabulary (kind "marian")

A config.json without "tokenizer" (written before the record existed) means the joint model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_model

from model.transformer import Transformer
from runtime.model_config import ModelConfig
from runtime.search import LENGTH_PENALTY
from runtime.tokenizer import TOKENIZER_FILES, Tokenizer, TokenizerError, kind_spec

FORMAT_REVISION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SPM_FILE = TOKENIZER_FILES["joint"][0]
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "default"  # English→German
DEFAULT_DE_EN_CHECKPOINT = Path(__file__).resolve().parent / "default-de-en"  # German→English


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message says which file and why."""


def save_checkpoint(
    directory: str | Path, model: Transformer, tokenizer: bytes | Tokenizer, metadata: dict[str, Any] | None = None
) -> Path:
    """Write a checkpoint; tokenizer is a serialized joint sentencepiece model or a Tokenizer of either kind."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_model(model, str(directory / WEIGHTS_FILE))
    if isinstance(tokenizer, bytes):
        (directory / SPM_FILE).write_bytes(tokenizer)
        spec = kind_spec("joint")
    else:
        spec = tokenizer.save(directory)
    config = {
        "format_revision": FORMAT_REVISION,
        "model": model.config.to_dict(),
        "tokenizer": spec,
        **(metadata or {}),
    }
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


def length_penalty(directory: str | Path) -> float:
    """The beam search length penalty α the checkpoint was tuned with (runtime.search.LENGTH_PENALTY if none)."""
    return float(read_config(directory).get("decoding", {}).get("length_penalty", LENGTH_PENALTY))


def tokenizer_spec(directory: str | Path) -> dict[str, Any]:
    """The checkpoint's tokenizer record {"kind", "files"}; the joint model for checkpoints without one."""
    path = Path(directory) / CONFIG_FILE
    spec = json.loads(path.read_text()).get("tokenizer") if path.exists() else None
    return spec or kind_spec("joint")


def load_tokenizer(directory: str | Path) -> Tokenizer:
    try:
        return Tokenizer.load(directory, tokenizer_spec(directory))
    except TokenizerError as e:
        raise CheckpointError(str(e)) from e


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
