"""The tiny PyTorch model shared by the model tests and the search tests (which decode with it as a reference),
and the random Hugging Face Marian folders (OPUS-MT's layout) that the Marian import and export tests and the
tokenizer's tests read."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from model.transformer import Transformer
from runtime.model_config import ModelConfig
from testkit.sentences import OWN_SENTENCES, own_sentences


@pytest.fixture
def tiny_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=50, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0
    )


@pytest.fixture
def tiny_model(tiny_config: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config).eval()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Models this small gain nothing from intra-op threads, and on a busy machine their spin-waits cost seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train_spm(texts: list[str], vocab_size: int) -> bytes:
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buffer,
        vocab_size=vocab_size,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return buffer.getvalue()


def build_marian_tokenizer(directory: Path) -> dict[str, int]:
    """OPUS-MT's tokenizer files in directory (separate source and target sentencepiece models and the vocabulary
    they share, with </s> = 0, <unk> = 1 and <pad> last); returns the vocabulary."""
    directory.mkdir(parents=True, exist_ok=True)
    source, target = _train_spm(own_sentences(240), 80), _train_spm([de for _, de in OWN_SENTENCES] * 5, 80)
    vocab = {"</s>": 0, "<unk>": 1}
    for blob in (source, target):
        processor = spm.SentencePieceProcessor(model_proto=blob)
        for i in range(processor.get_piece_size()):
            if not (processor.is_control(i) or processor.is_unknown(i)):
                vocab.setdefault(processor.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (directory / "source.spm").write_bytes(source)
    (directory / "target.spm").write_bytes(target)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    return vocab


def build_marian_folder(directory: Path, activation: str = "swish", seed: int = 2) -> Path:
    """A random MarianMTModel with OPUS-MT's tokenizer layout, saved as a Hugging Face folder.

    Random tied-embedding models tend to repeat one token; with this seed's weights the translations of
    tests/model/test_marian.py's SENTENCES differ in content and length (some end early, some run to the limit).
    """
    import transformers  # the Marian tests skip without it

    vocab = build_marian_tokenizer(directory)
    pad = vocab["<pad>"]
    (directory / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function=activation,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        max_position_embeddings=128,
        scale_embedding=True,
        dropout=0.0,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():  # weights large enough that translations depend on the source
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
            else:
                p.normal_(0, 0.3)
        model.model.shared.weight[pad].zero_()  # as in OPUS-MT: the decoder starts from a zero embedding
        model.final_logits_bias.normal_(0, 0.2)
        model.final_logits_bias[0, 0] += 3.0  # </s> now and then
    model.save_pretrained(directory)
    return directory


def until_eos(rows: torch.Tensor, eos: int) -> list[list[int]]:
    """Token ids of generate()'s rows without the start token and from eos on."""
    out = []
    for row in rows.tolist():
        tokens = row[1:]
        out.append(tokens[: tokens.index(eos)] if eos in tokens else tokens)
    return out
