"""Marian / OPUS-MT models in the Hugging Face format: ``python -m model.marian import --hf DIR --out DIR``, and
``python -m model.marian fetch NAME --out DIR`` to put such a folder on disk from the Hugging Face Hub.

A Hugging Face MarianMT folder holds config.json (a MarianConfig), model.safetensors
(or pytorch_model.bin), source.spm, target.spm and vocab.json. Its network is our
Transformer with Marian's conventions: post-norm, sinusoidal positions in halves
(all sines, then all cosines), swish FFNs (relu and gelu also read), a final logits
bias, the decoder started from the pad token, and two sentencepiece models whose pieces
get their ids from one shared vocabulary. Hugging Face keeps q, k and v as three matrices where we fuse
them (self-attention q|k|v, cross-attention k|v).

Both directions live here: ``load_marian`` reads such a folder into our model and
tokenizer, ``save_marian`` writes ours as one. Neither needs the transformers
package: the folder is JSON, tensors and sentencepiece models.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from model.checkpoint import save_checkpoint
from model.folders import staged_folder
from model.positional import sinusoidal_encoding
from model.transformer import Transformer
from runtime.model_config import ModelConfig
from runtime.tokenizer import Tokenizer, TokenizerError, kind_spec

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PICKLED_WEIGHTS_FILE = "pytorch_model.bin"  # read with torch.load(weights_only=True): tensors only, never code
SHARDED_WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
MAX_POSITIONS = 512  # OPUS-MT's max_position_embeddings and MarianTokenizer's model_max_length
HF_LAYER_NORM_EPS = 1e-5  # torch's default, which every Marian LayerNorm uses

# Hugging Face activation_function -> ours, and back.
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
MARIAN_ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu"}
# MarianConfig's defaults, for keys a config.json leaves out.
MARIAN_DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101,
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "activation_function": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "scale_embedding": False,
    "pad_token_id": 58100,
    "eos_token_id": 0,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
}
# Options of older (BART-derived) Marian configs that Hugging Face's MarianMTModel
# ignores; a model that needs them is not the network this format computes.
UNSUPPORTED_FLAGS = {
    "normalize_before": "pre-norm layers (Hugging Face Marian is post-norm and has no final layer norm)",
    "normalize_embedding": "a layer norm on the embeddings",
    "add_final_layer_norm": "a final layer norm",
    "add_bias_logits": "a separate logits bias",
}

# (our module, the Hugging Face modules whose weights it concatenates along the output dimension)
ENCODER_MODULES = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("self_attn.out_proj", ("self_attn.out_proj",)),
    ("ffn.fc1", ("fc1",)),
    ("ffn.fc2", ("fc2",)),
    ("attn_block.norm", ("self_attn_layer_norm",)),
    ("ffn_block.norm", ("final_layer_norm",)),
)
DECODER_MODULES = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("self_attn.out_proj", ("self_attn.out_proj",)),
    ("cross_attn.q_proj", ("encoder_attn.q_proj",)),
    ("cross_attn.kv_proj", ("encoder_attn.k_proj", "encoder_attn.v_proj")),
    ("cross_attn.out_proj", ("encoder_attn.out_proj",)),
    ("ffn.fc1", ("fc1",)),
    ("ffn.fc2", ("fc2",)),
    ("self_block.norm", ("self_attn_layer_norm",)),
    ("cross_block.norm", ("encoder_attn_layer_norm",)),
    ("ffn_block.norm", ("final_layer_norm",)),
)
EMBEDDING_NAMES = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
POSITION_NAMES = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
DECODER_POSITIONS = POSITION_NAMES[1]
UNDETERMINED = "und"  # ISO 639's code for a language not named: what a folder without languages would serve as
HUB_WEIGHTS = (WEIGHTS_FILE, PICKLED_WEIGHTS_FILE)  # of a Hub repository's weights, the first it has is fetched
LAYOUTS = ("ours", "opus-mt")
DEFAULT_LAYOUT = "opus-mt"  # the one CTranslate2's stock converter accepts


class MarianError(ValueError):
    """A Marian folder that cannot be read or a model that cannot be written as one; the message says why."""


def _unsupported(subject: str, problems: list[str]) -> MarianError:
    """One error for every problem found, CTranslate2-converter style."""
    listed = "".join(f"\n  - {p}" for p in problems)
    return MarianError(f"{subject}:{listed}")


# --- parameters --------------------------------------------------------------


def parameter_map(config: ModelConfig) -> list[tuple[str, tuple[str, ...]]]:
    """Each of our parameters (but final_logits_bias) and the Hugging Face parameters it fuses, in order."""
    pairs = [("embedding.weight", ("model.shared.weight",))]
    stacks = (
        ("encoder_layers", "model.encoder.layers", config.n_encoder_layers, ENCODER_MODULES),
        ("decoder_layers", "model.decoder.layers", config.n_decoder_layers, DECODER_MODULES),
    )
    for ours, theirs, count, modules in stacks:
        for i in range(count):
            for module, parts in modules:
                for kind in ("weight", "bias"):
                    pairs.append((f"{ours}.{i}.{module}.{kind}", tuple(f"{theirs}.{i}.{p}.{kind}" for p in parts)))
    if not config.tie_output:
        pairs.append(("output.weight", ("lm_head.weight",)))
    return pairs


def halves_order(d_model: int) -> Tensor:
    """Residual-stream dimensions in the "halves" order: interleaved dimension 2i goes to i, 2i+1 to d/2 + i."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


# Modules that read the residual stream (their weight's input columns follow it) and ones that
# write it or normalize it (their output rows follow it). Attention heads and the FFN's inner
# dimension are not part of the stream: q, k, v and fc1 outputs keep their order.
READS_STREAM = {"embedding", "output", "qkv_proj", "q_proj", "kv_proj", "fc1"}
WRITES_STREAM = {"out_proj", "fc2", "norm", "encoder_norm", "decoder_norm"}


def permute_residual(state: dict[str, Tensor], order: Tensor) -> dict[str, Tensor]:
    """Weights of the same function with the residual stream's dimensions reordered (new j = old order[j]).

    Sinusoidal positions added to the stream must be laid out in the new order too:
    ``halves_order`` turns an interleaved model into a halves one, its argsort back.
    """
    permuted = {}
    for name, tensor in state.items():
        module, _, kind = name.rpartition(".")
        leaf = module.rpartition(".")[2]
        if leaf in READS_STREAM and kind == "weight":
            tensor = tensor[:, order]
        elif leaf in WRITES_STREAM:
            tensor = tensor[order]
        else:
            assert leaf in READS_STREAM or name == "final_logits_bias", f"{name}: unknown place in the stream"
        permuted[name] = tensor
    return permuted


# --- reading -----------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MarianError(f"{path} is missing: not a Hugging Face Marian folder") from None
    except json.JSONDecodeError as e:
        raise MarianError(f"{path} is not valid JSON: {e}") from e


def read_weights(directory: Path) -> dict[str, Tensor]:
    """The tensors of model.safetensors (possibly sharded), else of pytorch_model.bin."""
    if (directory / WEIGHTS_FILE).is_file():
        return load_file(str(directory / WEIGHTS_FILE))
    if (directory / SHARDED_WEIGHTS_INDEX).is_file():
        shards = sorted(set(_read_json(directory / SHARDED_WEIGHTS_INDEX)["weight_map"].values()))
        return {name: t for shard in shards for name, t in load_file(str(directory / shard)).items()}
    if (directory / PICKLED_WEIGHTS_FILE).is_file():
        try:
            return torch.load(directory / PICKLED_WEIGHTS_FILE, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise MarianError(
                f"{directory / PICKLED_WEIGHTS_FILE} holds more than tensors and is not unpickled; "
                f"save its state dict as {WEIGHTS_FILE}"
            ) from e
    raise MarianError(f"{directory} has neither {WEIGHTS_FILE} nor {PICKLED_WEIGHTS_FILE}")


def read_tokenizer(directory: Path) -> Tokenizer:
    try:
        return Tokenizer.load(directory, kind_spec("marian"))
    except TokenizerError as e:
        raise MarianError(str(e)) from e


def model_config(
    hf: dict[str, Any], tokenizer_config: dict[str, Any], tokenizer: Tokenizer, where: Path | str
) -> ModelConfig:
    """Our ModelConfig of a Hugging Face MarianConfig; every unsupported option is reported in one error."""
    get = lambda key: MARIAN_DEFAULTS.get(key) if hf.get(key) is None else hf[key]
    problems = []
    if hf.get("model_type") != "marian":
        problems.append(f"model_type={hf.get('model_type')!r}: only 'marian' models are read")
    for key in ("encoder_attention_heads", "encoder_ffn_dim"):
        other = key.replace("encoder", "decoder")
        if get(key) != get(other):
            problems.append(f"{key}={get(key)} differs from {other}={get(other)}: both sides must be equal")
    activation = ACTIVATIONS.get(get("activation_function"))
    if activation is None:
        problems.append(f"activation_function={get('activation_function')!r}: use one of {sorted(ACTIVATIONS)}")
    if not get("share_encoder_decoder_embeddings"):
        problems.append("share_encoder_decoder_embeddings=false: separate source and target embeddings")
    if hf.get("decoder_vocab_size") not in (None, get("vocab_size")):
        problems.append(f"decoder_vocab_size={hf['decoder_vocab_size']} differs from vocab_size={get('vocab_size')}")
    if tokenizer_config.get("separate_vocabs"):
        problems.append("separate_vocabs=true (tokenizer_config.json): separate source and target vocabularies")
    problems += [f"{flag}=true: {what}" for flag, what in UNSUPPORTED_FLAGS.items() if hf.get(flag)]
    if hf.get("static_position_embeddings") is False:
        problems.append("static_position_embeddings=false: learned position embeddings")
    d_model, heads = get("d_model"), get("encoder_attention_heads")
    if d_model % heads or d_model % 2:
        problems.append(f"d_model={d_model} must be even and divisible by the {heads} attention heads")
    eos, pad = get("eos_token_id"), get("pad_token_id")
    if isinstance(eos, list):
        if len(eos) != 1:
            problems.append(f"eos_token_id={eos}: one end-of-sentence token is supported")
        eos = eos[0]
    vocab = tokenizer.vocab or {}
    missing = [p for p in ("<unk>", "</s>", "<pad>") if p not in vocab]
    if missing:
        problems.append(f"vocab.json lacks {missing}")
    elif (vocab["</s>"], vocab["<pad>"]) != (eos, pad):
        problems.append(
            f"vocab.json has </s>={vocab['</s>']}, <pad>={vocab['<pad>']} but config.json "
            f"eos_token_id={eos}, pad_token_id={pad}"
        )
    if vocab and max(vocab.values()) >= get("vocab_size"):
        problems.append(f"vocab.json has ids up to {max(vocab.values())} but vocab_size={get('vocab_size')}")
    if problems:
        raise _unsupported(f"{where} is not supported", problems)
    special = tokenizer.special_ids
    return ModelConfig(
        vocab_size=get("vocab_size"),
        d_model=d_model,
        n_heads=heads,
        n_encoder_layers=get("encoder_layers"),
        n_decoder_layers=get("decoder_layers"),
        d_ff=get("encoder_ffn_dim"),
        dropout=get("dropout"),
        attention_dropout=get("attention_dropout"),
        activation=activation,
        norm="post",
        positions="halves",
        scale_embeddings=bool(get("scale_embedding")),
        tie_output=bool(get("tie_word_embeddings")),
        final_logits_bias=True,  # load_marian drops a bias of zeros
        layer_norm_eps=HF_LAYER_NORM_EPS,
        pad_id=pad,
        unk_id=special.unk,
        bos_id=special.bos,
        eos_id=eos,
        decoder_start_id=pad if hf.get("decoder_start_token_id") is None else hf["decoder_start_token_id"],
    )


def weights_from_marian(hf: dict[str, Tensor], config: ModelConfig, where: Path | str) -> dict[str, Tensor]:
    """Our state dict of Hugging Face MarianMTModel tensors (fused projections, one embedding)."""
    problems = []
    embeddings = [hf[name] for name in EMBEDDING_NAMES if name in hf]
    if not embeddings:
        raise _unsupported(f"{where} is not supported", [f"no token embeddings ({' or '.join(EMBEDDING_NAMES)})"])
    if any(not torch.equal(e, embeddings[0]) for e in embeddings):
        problems.append("encoder and decoder token embeddings differ (not shared)")
    if config.tie_output and "lm_head.weight" in hf and not torch.equal(hf["lm_head.weight"], embeddings[0]):
        problems.append("lm_head.weight differs from the token embeddings although tie_word_embeddings=true")
    hf = {**hf, "model.shared.weight": embeddings[0]}
    pairs = parameter_map(config)
    used = {name for _, parts in pairs for name in parts} | set(EMBEDDING_NAMES) | {"final_logits_bias"}
    used |= {"lm_head.weight"} | set(POSITION_NAMES)
    missing = sorted(name for _, parts in pairs for name in parts if name not in hf)
    unexpected = sorted(set(hf) - used)
    if missing:
        problems.append(f"missing tensors {missing}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected}")
    for name in POSITION_NAMES:
        if name in hf:
            table = hf[name].float()
            expected = sinusoidal_encoding(torch.arange(table.shape[0]), config.d_model, "halves")
            # The OPUS-MT layout of our own models folds the start token's embedding into decoder position 0.
            rows = slice(1, None) if name == DECODER_POSITIONS else slice(None)
            if table.shape[1] != config.d_model or (table[rows] - expected[rows]).abs().max() > 1e-3:
                problems.append(f"{name} is not Marian's sinusoidal table (learned positions)")
    if problems:
        raise _unsupported(f"{where} is not supported", problems)
    state = {ours: torch.cat([hf[p] for p in parts]).float() for ours, parts in pairs}
    bias = hf.get("final_logits_bias", torch.zeros(1, config.vocab_size))
    state["final_logits_bias"] = bias.reshape(-1).float()
    if config.tie_output:
        state["output.weight"] = state["embedding.weight"]
    return state


def folded_start_token(
    weights: dict[str, Tensor], embedding: Tensor, config: ModelConfig, where: Path | str
) -> int | None:
    """The token our decoder starts from when a folder in the OPUS-MT layout folded its scaled embedding
    into decoder position 0 (and starts from a zero embedding, as Marian does); None when nothing is folded."""
    if DECODER_POSITIONS not in weights:
        return None
    folded = weights[DECODER_POSITIONS][0].float() - sinusoidal_encoding(torch.zeros(1), config.d_model, "halves")[0]
    if folded.abs().max() <= 1e-6:
        return None
    if embedding[config.decoder_start_id].any():
        raise _unsupported(
            f"{where} is not supported",
            ["decoder position 0 differs from the sinusoid, but the decoder start token's embedding is not zero"],
        )
    scaled = embedding * (config.d_model**0.5 if config.scale_embeddings else 1.0)
    distance = (scaled - folded).abs().max(dim=1).values
    token = int(distance.argmin())
    if distance[token] > 1e-4:
        raise _unsupported(
            f"{where} is not supported",
            ["decoder position 0 holds a vector that is no token's embedding: learned positions"],
        )
    return token


def read_configs(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """config.json and tokenizer_config.json ({} where there is none)."""
    tokenizer_path = directory / TOKENIZER_CONFIG_FILE
    return _read_json(directory / CONFIG_FILE), _read_json(tokenizer_path) if tokenizer_path.is_file() else {}


def load_marian(directory: str | Path) -> tuple[Transformer, Tokenizer, dict[str, Any]]:
    """Our model (eval mode) and tokenizer of a Hugging Face Marian folder, and checkpoint metadata
    (name, languages) from its tokenizer_config.json."""
    directory = Path(directory)
    hf_config, tokenizer_config = read_configs(directory)
    tokenizer = read_tokenizer(directory)
    config = model_config(hf_config, tokenizer_config, tokenizer, directory)
    weights = read_weights(directory)
    state = weights_from_marian(weights, config, directory)
    # A bias of zeros is no bias: the config says so, and ours -> Marian -> ours gives back our config.
    config = dataclasses.replace(config, final_logits_bias=bool(state["final_logits_bias"].any()))
    start = folded_start_token(weights, state["embedding.weight"], config, directory)
    if start is not None:
        config = dataclasses.replace(config, decoder_start_id=start)
    model = Transformer(config)
    model.load_state_dict(state, strict=True)
    return model.eval(), tokenizer, marian_metadata(directory, hf_config, tokenizer_config)


def marian_metadata(directory: Path, hf_config: dict[str, Any], tokenizer_config: dict[str, Any]) -> dict[str, Any]:
    """A Marian folder's checkpoint metadata: its name, and its languages as tokenizer_config.json names them
    (UNDETERMINED where it names none)."""
    return {
        "name": hf_config.get("_name_or_path") or directory.name,
        "source_language": tokenizer_config.get("source_lang") or UNDETERMINED,
        "target_language": tokenizer_config.get("target_lang") or UNDETERMINED,
        "imported_from": {"format": "huggingface-marian", "path": str(directory)},
    }


# --- writing -----------------------------------------------------------------


def _marian_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer as Marian's two models and a vocabulary; a joint model serves as both, its ids unchanged."""
    if tokenizer.vocab is not None:
        return tokenizer
    pieces = {tokenizer.source.id_to_piece(i): i for i in range(tokenizer.source.get_piece_size())}
    return Tokenizer(tokenizer.source, tokenizer.source, pieces)


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """The MarianConfig (config.json) of our ModelConfig."""
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.n_encoder_layers,
        "decoder_layers": config.n_decoder_layers,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": MARIAN_ACTIVATIONS[config.activation],
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": MAX_POSITIONS,
        "scale_embedding": config.scale_embeddings,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": config.tie_output,
        "is_encoder_decoder": True,
        "pad_token_id": config.pad_id,
        "eos_token_id": config.eos_id,
        "bos_token_id": config.bos_id,
        "forced_eos_token_id": config.eos_id,
        "decoder_start_token_id": config.decoder_start_id,
        "dtype": "float32",
    }


def generation_config(config: ModelConfig) -> dict[str, Any]:
    return {
        "decoder_start_token_id": config.decoder_start_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
        "forced_eos_token_id": config.eos_id,
        "pad_token_id": config.pad_id,
        "max_length": MAX_POSITIONS,
    }


def marian_export_problems(config: ModelConfig) -> list[str]:
    problems = []
    if config.norm != "post":
        problems.append(f"norm={config.norm!r}: Hugging Face Marian models are post-norm")
    if config.layer_norm_eps != HF_LAYER_NORM_EPS:
        problems.append(f"layer_norm_eps={config.layer_norm_eps}: Marian's layer norms use {HF_LAYER_NORM_EPS}")
    return problems


def opus_mt_order(config: ModelConfig) -> Tensor:
    """Our ids in the OPUS-MT layout's order (new id i = our id order[i]): <pad> moved to the end."""
    ids = torch.arange(config.vocab_size)
    return torch.cat([ids[ids != config.pad_id], ids[config.pad_id : config.pad_id + 1]])


def in_opus_mt_layout(config: ModelConfig) -> bool:
    """<pad> last and the decoder started from it: the layout CTranslate2's Marian converter assumes
    (an imported OPUS-MT model is in it already)."""
    return config.pad_id == config.vocab_size - 1 and config.decoder_start_id == config.pad_id


def _to_opus_mt_layout(
    state: dict[str, Tensor], config: ModelConfig, order: Tensor
) -> tuple[dict[str, Tensor], ModelConfig]:
    """Reorder the vocabulary (``order``: <pad> last), zero <pad>'s embedding and start the decoder from it,
    with the start token's scaled embedding folded into decoder position 0: what Marian, and CTranslate2's
    Marian converter, assume (the converter drops the last id and starts from a zero embedding)."""
    new_id = torch.argsort(order)
    state = dict(state)
    scale = config.d_model**0.5 if config.scale_embeddings else 1.0
    start_vector = state["embedding.weight"][config.decoder_start_id] * scale
    for name in ("embedding.weight", "output.weight", "final_logits_bias"):
        if name in state:
            state[name] = state[name][order].clone()
    state["embedding.weight"][-1] = 0.0
    if config.tie_output:
        state["output.weight"] = state["embedding.weight"]
    positions = sinusoidal_encoding(torch.arange(MAX_POSITIONS), config.d_model, "halves")
    positions[0] += start_vector
    state[DECODER_POSITIONS] = positions
    remap = lambda i: int(new_id[i])
    config = dataclasses.replace(
        config,
        pad_id=config.vocab_size - 1,
        unk_id=remap(config.unk_id),
        bos_id=remap(config.bos_id),
        eos_id=remap(config.eos_id),
        decoder_start_id=config.vocab_size - 1,
    )
    return state, config


def save_marian(
    model: Transformer,
    tokenizer: Tokenizer,
    directory: str | Path,
    source_lang: str,
    target_lang: str,
    layout: str = DEFAULT_LAYOUT,
) -> Path:
    """Write model and tokenizer as a Hugging Face MarianMTModel folder (MarianTokenizer files included).

    An interleaved model's residual stream is permuted to the halves layout Marian computes. ``layout``
    "opus-mt" (the default) writes OPUS-MT's conventions (see ``_to_opus_mt_layout``), which CTranslate2's
    converter needs; "ours" keeps our ids and start token (ours -> Marian -> ours is exact).
    """
    config, directory = model.config, Path(directory)
    problems = marian_export_problems(config)
    if layout not in LAYOUTS:
        problems.append(f"layout={layout!r}: use one of {LAYOUTS}")
    if problems:
        raise _unsupported("the Marian format cannot hold this model", problems)
    state = {name: t.detach().cpu().float() for name, t in model.state_dict().items()}
    if config.positions == "interleaved":
        state = permute_residual(state, halves_order(config.d_model))
    marian = _marian_tokenizer(tokenizer)
    opus_mt = layout == "opus-mt" and not in_opus_mt_layout(config)
    if opus_mt:
        order = opus_mt_order(config)
        state, config = _to_opus_mt_layout(state, config, order)
        pieces = [marian.pieces[int(i)] for i in order]
        marian = Tokenizer(marian.source, marian.target, {p: i for i, p in enumerate(pieces)})
    tensors = {}
    for ours, parts in parameter_map(config):
        tensors.update(zip(parts, (t.contiguous() for t in state[ours].chunk(len(parts))), strict=True))
    bias = state["final_logits_bias"] if config.final_logits_bias else torch.zeros(config.vocab_size)
    tensors["final_logits_bias"] = bias.reshape(1, -1).contiguous()
    if opus_mt:
        tensors[DECODER_POSITIONS] = state[DECODER_POSITIONS].contiguous()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    marian.save(directory)
    piece = marian.pieces
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": source_lang,
        "target_lang": target_lang,
        "separate_vocabs": False,
        "model_max_length": MAX_POSITIONS,
        "unk_token": piece[config.unk_id],
        "eos_token": piece[config.eos_id],
        "pad_token": piece[config.pad_id],
    }
    for name, content in (
        (CONFIG_FILE, hf_config(config)),
        (GENERATION_CONFIG_FILE, generation_config(config)),
        (TOKENIZER_CONFIG_FILE, tokenizer_config),
    ):
        (directory / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return directory


# --- import command ----------------------------------------------------------


def import_marian(hf_dir: Path, out: Path, force: bool = False, metadata: dict[str, Any] | None = None) -> Path:
    """Read a Hugging Face Marian folder and write it as our checkpoint (written whole or not at all). A model
    whose languages neither the folder nor ``metadata`` names is refused: served as "und", no request could
    choose it by its languages, and the server's language detection, on by default, knows no "und"."""
    if out.exists() and not force:
        raise MarianError(f"{out} already exists, use --force to override")
    metadata = {**marian_metadata(hf_dir, *read_configs(hf_dir)), **(metadata or {})}
    if unnamed := [side for side in ("source", "target") if metadata[f"{side}_language"] == UNDETERMINED]:
        flags = " and ".join(f"--{side}-language" for side in unnamed)
        raise MarianError(
            f"{hf_dir / TOKENIZER_CONFIG_FILE} names no {' and no '.join(unnamed)} language: give {flags} "
            "(ISO 639-1 codes, as in the model's name: opus-mt-en-fr is en to fr); requests choose a model by them"
        )
    model, tokenizer, _ = load_marian(hf_dir)
    with staged_folder(out) as folder:
        save_checkpoint(folder, model, tokenizer, metadata)
    return out


def fetch_marian(repo_id: str, out: Path, force: bool = False) -> Path:
    """The files an import reads of a MarianMT model on the Hugging Face Hub (``Helsinki-NLP/opus-mt-en-fr``),
    downloaded into ``out`` (written whole or not at all): the one command here that uses the network."""
    if out.exists() and not force:
        raise MarianError(f"{out} already exists, use --force to override")
    try:
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub.errors import HTTPError, RepositoryNotFoundError
    except ImportError as e:
        raise MarianError(f"fetching needs huggingface_hub ({e}): pip install -e '.[marian]'") from e

    wanted = [CONFIG_FILE, *kind_spec("marian")["files"]]
    try:
        files = set(HfApi().list_repo_files(repo_id))
        weights = [name for name in HUB_WEIGHTS if name in files][:1]
        if missing := [name for name in wanted if name not in files] + ([] if weights else [" or ".join(HUB_WEIGHTS)]):
            raise MarianError(f"{repo_id} is not a MarianMT model folder: it has no {', '.join(missing)}")
        optional = [TOKENIZER_CONFIG_FILE] if TOKENIZER_CONFIG_FILE in files else []
        with staged_folder(out) as folder:
            for name in [*wanted, *optional, *weights]:
                hf_hub_download(repo_id, name, local_dir=folder)
            shutil.rmtree(folder / ".cache", ignore_errors=True)  # the download's own bookkeeping
    except RepositoryNotFoundError as e:
        raise MarianError(
            f"{repo_id}: no such model on the Hugging Face Hub, or a private one (OPUS-MT's are named like "
            "Helsinki-NLP/opus-mt-en-fr: https://huggingface.co/Helsinki-NLP)"
        ) from e
    except (OSError, HTTPError) as e:
        raise MarianError(
            f"cannot fetch {repo_id} from the Hugging Face Hub ({type(e).__name__}: {e}). Without a network here, "
            f"run this command where huggingface.co can be reached (or set HF_ENDPOINT to a mirror) and copy {out} "
            f"over, or download {', '.join([*wanted, TOKENIZER_CONFIG_FILE])} and {' or '.join(HUB_WEIGHTS)} from "
            f"https://huggingface.co/{repo_id}/tree/main into one folder"
        ) from e
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    imports = commands.add_parser("import", help="convert a Hugging Face MarianMT folder into our checkpoint")
    imports.add_argument("--hf", type=Path, required=True, help="Hugging Face MarianMT folder (on disk)")
    imports.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    imports.add_argument("--name", help="model name (default: the folder's)")
    imports.add_argument(
        "--source-language",
        help="source language, ISO 639-1 (default: tokenizer_config.json's source_lang; required without one)",
    )
    imports.add_argument(
        "--target-language",
        help="target language, ISO 639-1 (default: tokenizer_config.json's target_lang; required without one)",
    )
    imports.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    fetch = commands.add_parser("fetch", help="download a MarianMT model's folder from the Hugging Face Hub")
    fetch.add_argument("repo_id", help="the model's name on the Hub, e.g. Helsinki-NLP/opus-mt-en-fr")
    fetch.add_argument("--out", type=Path, required=True, help="folder to write (then: import --hf OUT)")
    fetch.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            done = f"fetched {args.repo_id} to {fetch_marian(args.repo_id, args.out, args.force)}"
        else:
            given = {
                "name": args.name,
                "source_language": args.source_language,
                "target_language": args.target_language,
            }
            metadata = {k: v for k, v in given.items() if v}
            done = f"imported {args.hf} to {import_marian(args.hf, args.out, args.force, metadata)}"
    except MarianError as e:
        print(f"marian: {e}", file=sys.stderr)
        return 1
    print(done, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
