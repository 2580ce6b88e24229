"""Hugging Face Marian (OPUS-MT) folders read into our model: same logits, same translations.

Nothing is downloaded: small random MarianMTModels in OPUS-MT's layout (separate source
and target sentencepiece models, a shared vocab.json with </s> = 0, <unk> = 1 and <pad>
last, the decoder started from <pad>) are built and saved here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from model.checkpoint import load_checkpoint, save_checkpoint
from model.marian import MarianError, load_marian, main
from model.translate import TorchTranslator, row_shape
from runtime.batch import DecodeBatch, EncodedSources, pad_sources
from runtime.compact_rows import CompactRows
from runtime.search import Decoding
from runtime.tokenizer import Tokenizer
from testkit.sentences import own_sentences
from tests.torch_fixtures import build_marian_folder, until_eos

transformers = pytest.importorskip("transformers")
pytestmark = [
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
    pytest.mark.usefixtures("one_torch_thread"),
]

SENTENCES = own_sentences(240)[::17] + ["Zwei Hunde spielen im Schnee.", "A ☃ is not in the vocabulary."]


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """activation -> (folder, our model, our tokenizer, transformers' model), each built once."""
    built = {}

    def get(activation: str = "swish"):
        if activation not in built:
            folder = build_marian_folder(tmp_path_factory.mktemp(f"marian_{activation}"), activation)
            model, tokenizer, _ = load_marian(folder)
            built[activation] = folder, model, tokenizer, transformers.MarianMTModel.from_pretrained(folder).eval()
        return built[activation]

    return get


@pytest.mark.parametrize("activation", ["swish", "relu"])
def test_tokenizer_and_logits_equal_transformers(marian, activation):
    folder, model, tokenizer, reference = marian(activation)
    c = model.config
    assert (c.positions, c.norm, c.eos_id) == ("halves", "post", 0)
    assert c.pad_id == c.decoder_start_id == c.vocab_size - 1
    batch = transformers.MarianTokenizer.from_pretrained(folder)(SENTENCES, padding=True, return_tensors="pt")
    src, mask = pad_sources(tokenizer.encode_source(SENTENCES), c.pad_id, c.eos_id)
    assert src.tolist() == batch["input_ids"].tolist()
    assert mask.tolist() == batch["attention_mask"].bool().tolist()
    tgt = torch.randint(0, c.vocab_size, (len(SENTENCES), 12), generator=torch.Generator().manual_seed(1))
    tgt[:, 0] = c.decoder_start_id
    with torch.no_grad():
        ours = model(torch.from_numpy(src), torch.from_numpy(mask), tgt)
        theirs = reference(**batch, decoder_input_ids=tgt).logits
    assert (ours - theirs).abs().max() <= 1e-4


@pytest.mark.parametrize("activation", ["swish", "relu"])
def test_greedy_equals_generate(marian, activation):
    _, model, tokenizer, reference = marian(activation)
    c, limit = model.config, 16  # every sentence here is long enough to be searched up to the limit
    ids = tokenizer.encode_source(SENTENCES)
    ours = TorchTranslator(model, tokenizer, max_output_tokens=limit).translate_ids(ids)
    src, mask = (torch.from_numpy(x) for x in pad_sources(ids, c.pad_id, c.eos_id))
    with torch.no_grad():
        # limit - 1 free tokens, then eos forced: we stop there without eos, the same words.
        rows = reference.generate(
            input_ids=src, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=limit
        )
    assert ours == until_eos(rows, c.eos_id)
    assert len({len(row) for row in ours}) > 1 and len({tuple(row) for row in ours}) > 3


class EndAtLimit(transformers.LogitsProcessor):
    """Our BeamSearch at max_length: eos is the only way on, scored with its own log-probability
    (Hugging Face's forced_eos_token_id would score it 0)."""

    def __init__(self, limit: int, eos: int) -> None:
        self.limit, self.eos = limit, eos

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] < self.limit:
            return scores
        ended = torch.full_like(scores, -float("inf"))
        ended[:, self.eos] = scores[:, self.eos]
        return ended


def test_beam_equals_generate_without_length_penalty(marian):
    """Our BeamSearch is Hugging Face's beam search with early_stopping=True; only the length
    normalization differs (GNMT ((5 + n) / 6)^alpha vs n^length_penalty), so with alpha = 0 and
    length_penalty = 0 both rank by log-probability and must find the same translations."""
    _, model, tokenizer, reference = marian()
    c, beam, limit = model.config, 4, 16
    ids = tokenizer.encode_source(SENTENCES)
    src, mask = pad_sources(ids, c.pad_id, c.eos_id)
    translator = TorchTranslator(model, tokenizer)
    with torch.no_grad():
        cross_k, cross_v = (
            t.numpy() for t in model.cross_kv(model.encode(torch.from_numpy(src), torch.from_numpy(mask)))
        )
        rows = CompactRows(row_shape(c))
        batch = DecodeBatch(translator._step, Decoding(c.eos_id, alpha=0.0), rows)
        batch.add(list(range(len(ids))), EncodedSources(cross_k, cross_v, mask), [beam] * len(ids), [limit] * len(ids))
        results = batch.drain()
        rows = reference.generate(
            input_ids=torch.from_numpy(src),
            attention_mask=torch.from_numpy(mask),
            num_beams=beam,
            do_sample=False,
            length_penalty=0.0,
            early_stopping=True,
            max_new_tokens=limit,
            forced_eos_token_id=None,
            logits_processor=transformers.LogitsProcessorList([EndAtLimit(limit, c.eos_id)]),
        )
    ours = [results[i].tokens for i in range(len(ids))]
    assert ours == until_eos(rows, c.eos_id)
    assert len({len(row) for row in ours}) > 1 and len({tuple(row) for row in ours}) > 3


def test_import_command_writes_a_checkpoint(marian, tmp_path, capsys):
    folder, model, tokenizer, _ = marian()
    out = tmp_path / "checkpoint"
    assert main(["import", "--hf", str(folder), "--out", str(out), "--name", "opus-mt-test"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["tokenizer"] == {"kind": "marian", "files": ["source.spm", "target.spm", "vocab.json"]}
    assert (config["name"], config["source_language"], config["target_language"]) == ("opus-mt-test", "en", "de")
    loaded, loaded_tokenizer = load_checkpoint(out)
    assert loaded.config == model.config
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert loaded_tokenizer.encode_source(SENTENCES) == tokenizer.encode_source(SENTENCES)
    ids = tokenizer.encode_source(SENTENCES[:3])
    assert TorchTranslator(loaded, loaded_tokenizer).translate_ids(ids) == TorchTranslator(
        model, tokenizer
    ).translate_ids(ids)
    assert main(["import", "--hf", str(folder), "--out", str(out)]) == 1
    assert "already exists, use --force to override" in capsys.readouterr().err


def test_pytorch_model_bin_is_read_as_tensors_only(marian, tmp_path):
    folder, model, _, _ = marian()
    pickled = tmp_path / "pickled"
    shutil.copytree(folder, pickled)
    torch.save(load_file(str(pickled / "model.safetensors")), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    loaded, _, _ = load_marian(pickled)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    torch.save({"weights": np.ones(3), "hook": print}, pickled / "pytorch_model.bin")  # not just tensors
    with pytest.raises(MarianError, match="holds more than tensors and is not unpickled"):
        load_marian(pickled)


def test_unsupported_options_are_listed_in_one_error(marian, tmp_path):
    folder = shutil.copytree(marian()[0], tmp_path / "unsupported")
    config = json.loads((folder / "config.json").read_text())
    config.update(
        share_encoder_decoder_embeddings=False,
        normalize_before=True,
        activation_function="gelu_new",
        decoder_attention_heads=2,
        decoder_ffn_dim=128,
    )
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(MarianError, match="unsupported is not supported") as error:
        load_marian(folder)
    for option in (
        "share_encoder_decoder_embeddings=false",
        "normalize_before=true",
        "activation_function='gelu_new'",
        "encoder_attention_heads=4 differs from decoder_attention_heads=2",
        "encoder_ffn_dim=64 differs from decoder_ffn_dim=128",
    ):
        assert option in str(error.value)


def test_checkpoints_without_a_tokenizer_record_load_as_joint(tiny_checkpoint: Path, tmp_path):
    old = shutil.copytree(tiny_checkpoint, tmp_path / "old")
    config = json.loads((old / "config.json").read_text())
    assert config.pop("tokenizer") == {"kind": "joint", "files": ["sentencepiece.model"]}
    (old / "config.json").write_text(json.dumps(config))
    model, tokenizer = load_checkpoint(old)
    assert tokenizer.kind == "joint" and tokenizer.vocab_size == model.config.vocab_size
    assert Tokenizer.load(old, "sentencepiece.model").encode_source(SENTENCES) == tokenizer.encode_source(SENTENCES)
    # Saving what was loaded writes the record.
    save_checkpoint(tmp_path / "new", model, tokenizer)
    assert json.loads((tmp_path / "new" / "config.json").read_text())["tokenizer"]["kind"] == "joint"


@pytest.mark.parametrize("names", [{}, {"source_lang": "en"}], ids=["neither", "no target"])
def test_an_import_whose_languages_nothing_names_is_refused(marian, tmp_path, capsys, names):
    """Served as "und", no request could choose the model by its languages: the flags must name them."""
    folder = shutil.copytree(marian()[0], tmp_path / "unnamed")
    (folder / "tokenizer_config.json").write_text(json.dumps(names))
    out = tmp_path / "checkpoint"
    assert main(["import", "--hf", str(folder), "--out", str(out)]) == 1
    unnamed = "--target-language" if names else "--source-language and --target-language"
    assert f"names no {'' if names else 'source and no '}target language: give {unnamed} (" in capsys.readouterr().err
    assert not out.exists()
    flags = ["--source-language", "en", "--target-language", "fr"]
    assert main(["import", "--hf", str(folder), "--out", str(out), *flags[2 if names else 0 :]]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["source_language"], config["target_language"]) == ("en", "fr")


def test_fetch_downloads_what_the_import_reads(marian, tmp_path, monkeypatch, capsys):
    """The Hub stood in for by a built folder with more files than the import reads: only those come, the
    safetensors weights rather than the pickled ones, and what comes imports."""
    import huggingface_hub

    hub = shutil.copytree(marian()[0], tmp_path / "hub")
    (hub / "pytorch_model.bin").write_bytes(b"not fetched")
    (hub / "tf_model.h5").write_bytes(b"not fetched")
    fetched = []

    def download(repo_id: str, filename: str, local_dir: Path) -> str:
        fetched.append(filename)
        (Path(local_dir) / ".cache" / "huggingface").mkdir(parents=True, exist_ok=True)
        return shutil.copy(hub / filename, local_dir)

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", lambda self, repo_id: sorted(os.listdir(hub)))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    out = tmp_path / "opus-mt-en-de"
    assert main(["fetch", "Helsinki-NLP/opus-mt-en-de", "--out", str(out)]) == 0
    assert "fetched Helsinki-NLP/opus-mt-en-de to" in capsys.readouterr().err
    expected = ["config.json", "source.spm", "target.spm", "vocab.json", "tokenizer_config.json", "model.safetensors"]
    assert fetched == expected and sorted(os.listdir(out)) == sorted(expected)
    assert main(["import", "--hf", str(out), "--out", str(tmp_path / "checkpoint")]) == 0
    assert main(["fetch", "Helsinki-NLP/opus-mt-en-de", "--out", str(out)]) == 1  # not over a folder without --force
    assert "already exists, use --force to override" in capsys.readouterr().err


def test_fetch_without_a_network_says_what_to_do(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what a machine without the Hub sees, at once
    out = tmp_path / "opus-mt-en-fr"
    assert main(["fetch", "Helsinki-NLP/opus-mt-en-fr", "--out", str(out)]) == 1
    error = capsys.readouterr().err
    assert error.startswith("marian: cannot fetch Helsinki-NLP/opus-mt-en-fr from the Hugging Face Hub (")
    assert "run this command where huggingface.co can be reached" in error
    assert "https://huggingface.co/Helsinki-NLP/opus-mt-en-fr/tree/main" in error
    assert not out.exists()
    with pytest.raises(SystemExit):
        main(["fetch", "--out", str(out)])  # no model name: argparse's usage error
