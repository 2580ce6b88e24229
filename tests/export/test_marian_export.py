"""Our checkpoints in the Hugging Face Marian format, and Marian models through our ONNX export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from export import __main__ as export_main
from model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint, save_checkpoint
from model.marian import halves_order, load_marian, opus_mt_order, permute_residual
from model.marian import main as marian_main
from model.transformer import Transformer
from model.translate import TorchTranslator
from runtime import offline
from runtime.backend import OrtBackend
from runtime.batch import pad_sources
from runtime.manifest import read_manifest, sha256
from runtime.model_config import ModelConfig
from runtime.options import EngineSettings, RuntimeOptions
from tests.conftest import own_sentences
from tests.torch_fixtures import build_marian_folder, until_eos

transformers = pytest.importorskip("transformers")
pytestmark = [
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
    pytest.mark.usefixtures("one_torch_thread"),
]

SENTENCES = own_sentences(240)[::11]
OUR_LAYOUT = ("--marian-layout", "ours")  # our ids and start token, for an exact round trip


def export_to_marian(checkpoint: Path, out: Path, *flags: str) -> Path:
    assert export_main.main(["--format", "marian", *flags, "--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def tiny_marian(tiny_checkpoint: Path, tmp_path_factory) -> Path:
    return export_to_marian(tiny_checkpoint, tmp_path_factory.mktemp("tiny_marian") / "marian", *OUR_LAYOUT)


@pytest.fixture(scope="module")
def imported_checkpoint(tmp_path_factory) -> Path:
    """A random OPUS-MT-style Hugging Face folder imported as our checkpoint."""
    folder = build_marian_folder(tmp_path_factory.mktemp("hf") / "opus-mt-en-de")
    out = tmp_path_factory.mktemp("imported") / "checkpoint"
    assert marian_main(["import", "--hf", str(folder), "--out", str(out)]) == 0
    return out


def assert_loads_in_transformers_with_our_translations(checkpoint: Path, folder: Path, sentences: list[str]) -> None:
    model, tokenizer = load_checkpoint(checkpoint)
    c, limit = model.config, 16
    reference, info = transformers.MarianMTModel.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info
    batch = transformers.MarianTokenizer.from_pretrained(folder)(sentences, padding=True, return_tensors="pt")
    ids = tokenizer.encode_source(sentences)
    assert batch["input_ids"].tolist() == pad_sources(ids, c.pad_id, c.eos_id)[0].tolist()
    tgt = torch.randint(4, c.vocab_size, (len(sentences), 10), generator=torch.Generator().manual_seed(0))
    tgt[:, 0] = c.decoder_start_id
    with torch.no_grad():
        ours = model(batch["input_ids"], batch["attention_mask"].bool(), tgt)
        assert (ours - reference.eval()(**batch, decoder_input_ids=tgt).logits).abs().max() <= 1e-4
        rows = reference.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=limit)
    assert TorchTranslator(model, tokenizer, max_output_tokens=limit).translate_ids(ids) == until_eos(rows, c.eos_id)


def test_marian_export_loads_in_transformers(tiny_checkpoint: Path, tiny_marian: Path):
    assert {p.name for p in tiny_marian.iterdir()} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "source.spm",
        "target.spm",
        "tokenizer_config.json",
        "vocab.json",
    }
    assert (tiny_marian / "source.spm").read_bytes() == (tiny_checkpoint / "sentencepiece.model").read_bytes()
    assert_loads_in_transformers_with_our_translations(tiny_checkpoint, tiny_marian, SENTENCES)


def test_default_model_exports_to_marian_in_our_layout(tmp_path: Path):
    folder = export_to_marian(DEFAULT_CHECKPOINT, tmp_path / "marian", *OUR_LAYOUT)
    assert_loads_in_transformers_with_our_translations(DEFAULT_CHECKPOINT, folder, SENTENCES[:6])


def test_round_trip_ours_marian_ours_is_exact(tiny_checkpoint: Path, tiny_marian: Path, tmp_path: Path):
    original, tokenizer = load_checkpoint(tiny_checkpoint)
    imported, imported_tokenizer, _ = load_marian(tiny_marian)
    assert imported.config == ModelConfig.from_dict({**original.config.to_dict(), "positions": "halves"})
    back = permute_residual(imported.state_dict(), torch.argsort(halves_order(original.config.d_model)))
    for name, tensor in original.state_dict().items():
        assert torch.equal(tensor, back[name]), name
    ids = tokenizer.encode_source(SENTENCES)
    assert imported_tokenizer.encode_source(SENTENCES) == ids
    for beam in (1, 4):
        ours = TorchTranslator(original, tokenizer).translate_ids(ids, beam)
        assert TorchTranslator(imported, imported_tokenizer).translate_ids(ids, beam) == ours
    # Marian -> ours -> Marian gives back the same folder.
    assert marian_main(["import", "--hf", str(tiny_marian), "--out", str(tmp_path / "imported")]) == 0
    again = export_to_marian(tmp_path / "imported", tmp_path / "again", *OUR_LAYOUT)
    for name in ("source.spm", "target.spm", "vocab.json", "config.json", "generation_config.json"):
        assert (again / name).read_bytes() == (tiny_marian / name).read_bytes(), name
    first, second = load_file(str(tiny_marian / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_unsupported_model_is_not_written(tiny_checkpoint: Path, tmp_path: Path, capsys):
    model, tokenizer = load_checkpoint(tiny_checkpoint)
    config = ModelConfig.from_dict({**model.config.to_dict(), "norm": "pre", "layer_norm_eps": 1e-6})
    save_checkpoint(tmp_path / "pre_norm", Transformer(config), tokenizer)
    out = tmp_path / "marian"
    assert export_main.main(["--format", "marian", "--checkpoint", str(tmp_path / "pre_norm"), "--out", str(out)]) == 1
    error = capsys.readouterr().err
    assert "norm='pre': Hugging Face Marian models are post-norm" in error and "layer_norm_eps=1e-06" in error
    assert not out.exists()


def test_imported_marian_model_exports_to_onnx_and_serves(imported_checkpoint: Path, tmp_path: Path):
    out = tmp_path / "onnx"
    assert export_main.main(["--checkpoint", str(imported_checkpoint), "--out", str(out)]) == 0
    manifest = read_manifest(out)
    assert manifest["variants"]["fp32"]["parity"]["passed"] is True
    assert manifest["variants"]["fp32"]["quality"]["greedy_token_agreement_with_pytorch"] == 1.0
    assert manifest["tokenizer"] == {"kind": "marian", "files": ["source.spm", "target.spm", "vocab.json"]}
    assert {"source.spm", "target.spm", "vocab.json"} <= set(manifest["files"])
    assert (manifest["source_language"], manifest["target_language"]) == ("en", "de")
    model, tokenizer = load_checkpoint(imported_checkpoint)
    served = OrtBackend(out, RuntimeOptions(settings=EngineSettings(provider="cpu")))
    reference = TorchTranslator(model, tokenizer)
    assert offline.translate(served, SENTENCES) == reference.translate(SENTENCES)
    assert offline.translate(served, SENTENCES, beam=4) == reference.translate(SENTENCES, beam=4)
    # Manifests written before the tokenizer record name one joint sentencepiece file.
    manifest["tokenizer"] = "source.spm"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert OrtBackend(out, RuntimeOptions(settings=EngineSettings(provider="cpu"))).tokenizer.kind == "joint"


def test_ctranslate2_translates_an_imported_opus_mt_model_as_we_do(imported_checkpoint: Path, tmp_path: Path):
    """A third implementation: CTranslate2's converter reads the Hugging Face folder (its Marian loader
    assumes OPUS-MT's layout, <pad> last and a zero start embedding, as our import keeps it)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    model, tokenizer = load_checkpoint(imported_checkpoint)
    folder = export_to_marian(imported_checkpoint, tmp_path / "marian")
    ctranslate2.converters.TransformersConverter(str(folder)).convert(str(tmp_path / "ct2"))
    limit = 16
    ids = tokenizer.encode_source(SENTENCES)
    pieces = [[tokenizer.pieces[i] for i in row] + ["</s>"] for row in ids]
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", inter_threads=1, intra_threads=1)
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=limit - 1, min_decoding_length=0)
    theirs = [[tokenizer.vocab[p] for p in r.hypotheses[0]] for r in results]
    assert TorchTranslator(model, tokenizer, max_output_tokens=limit).translate_ids(ids) == theirs


def test_default_export_converts_with_ctranslate2(tiny_checkpoint: Path, tmp_path: Path):
    """`python -m export --format marian` without --marian-layout writes what CTranslate2's stock converter
    takes (it rejects our layout: it drops the last id as <pad>)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    out = export_to_marian(tiny_checkpoint, tmp_path / "marian")
    ctranslate2.converters.TransformersConverter(str(out)).convert(str(tmp_path / "ct2"))
    assert (tmp_path / "ct2" / "model.bin").is_file()


@pytest.mark.parametrize("checkpoint", ["tiny", "default"])
def test_opus_mt_layout_translates_the_same_in_transformers_ctranslate2_and_back(
    checkpoint: str, tiny_checkpoint: Path, tmp_path: Path
):
    """The default --marian-layout, opus-mt: <pad> last with a zero embedding, the decoder started from it,
    our start token's scaled embedding folded into decoder position 0. transformers gives our logits (bar
    <pad>'s), CTranslate2's stock converter accepts the folder and translates as we do, and it imports back."""
    checkpoint_dir = tiny_checkpoint if checkpoint == "tiny" else DEFAULT_CHECKPOINT
    sentences = SENTENCES if checkpoint == "tiny" else SENTENCES[:8]
    out = export_to_marian(checkpoint_dir, tmp_path / "opus")
    model, tokenizer = load_checkpoint(checkpoint_dir)
    c, limit = model.config, 16
    order = opus_mt_order(c)
    new_id = torch.argsort(order)
    vocab = json.loads((out / "vocab.json").read_text())
    assert vocab["<pad>"] == c.vocab_size - 1 == max(vocab.values())
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["decoder_start_token_id"] == hf_config["pad_token_id"] == c.vocab_size - 1
    assert hf_config["eos_token_id"] == int(new_id[c.eos_id])

    ids = tokenizer.encode_source(sentences)
    ours = TorchTranslator(model, tokenizer, max_output_tokens=limit).translate_ids(ids)
    reference = transformers.MarianMTModel.from_pretrained(out).eval()
    batch = transformers.MarianTokenizer.from_pretrained(out)(sentences, padding=True, return_tensors="pt")
    src = torch.from_numpy(pad_sources(ids, c.pad_id, c.eos_id)[0])
    assert batch["input_ids"].tolist() == new_id[src].tolist()
    tgt = torch.randint(4, c.vocab_size, (len(sentences), 10), generator=torch.Generator().manual_seed(0))
    tgt[:, 0] = c.decoder_start_id
    with torch.no_grad():
        logits = model(src, batch["attention_mask"].bool(), tgt)
        hf_tgt = new_id[tgt]
        hf_tgt[:, 0] = c.vocab_size - 1
        theirs = reference(**batch, decoder_input_ids=hf_tgt).logits
        assert (logits[..., order[:-1]] - theirs[..., :-1]).abs().max() <= 1e-4
        rows = reference.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=limit, bad_words_ids=None)
    assert [order[row].tolist() for row in until_eos(rows, int(new_id[c.eos_id]))] == ours

    ctranslate2 = pytest.importorskip("ctranslate2")
    ctranslate2.converters.TransformersConverter(str(out)).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", inter_threads=1, intra_threads=1)
    piece = {i: p for p, i in vocab.items()}
    pieces = [[piece[int(new_id[i])] for i in row] + ["</s>"] for row in ids]
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=limit - 1, min_decoding_length=0)
    assert [order[[vocab[p] for p in r.hypotheses[0]]].tolist() for r in results] == ours

    imported, imported_tokenizer, _ = load_marian(out)
    assert imported.config.decoder_start_id == int(new_id[c.decoder_start_id])
    again = TorchTranslator(imported, imported_tokenizer, max_output_tokens=limit)
    assert imported_tokenizer.decode(again.translate_ids(imported_tokenizer.encode_source(sentences))) == (
        tokenizer.decode(ours)
    )


def test_marian_layout_needs_the_marian_format(tiny_checkpoint: Path, tmp_path: Path, capsys):
    args = ["--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "x"), "--marian-layout", "ours"]
    assert export_main.main(args) == 1
    assert "--marian-layout applies to --format marian only" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_benchmark_against_ctranslate2_times_both_engines_on_the_same_ids(
    tiny_checkpoint: Path, multi30k: Path, tmp_path: Path, capsys
):
    pytest.importorskip("ctranslate2")
    from export.benchmark import main as benchmark_main

    flags = [
        "--against",
        "ctranslate2",
        "--checkpoint",
        str(tiny_checkpoint),
        "--data",
        str(multi30k),
        "--sentences",
        "6",
        "--repeats",
        "1",
        "--cap",
        "12",
        "--work-dir",
        str(tmp_path),
    ]
    assert benchmark_main(flags) == 0
    out = capsys.readouterr().out
    assert "outputs capped at 12 tokens" in out and "| CT2 float32 |" in out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| batch")]
    assert [row[0].strip() for row in rows] == [
        "batch 1, greedy",
        "batch 32, greedy",
        "batch 1, beam 4",
        "batch 32, beam 4",
    ]
    assert all(float(cell.replace(",", "")) > 0 for row in rows for cell in row[1:4])  # ours fp32, int8, CT2
    # A wrong mapping between our ids and CT2's pieces would make no output identical.
    assert max(float(row[6].strip().rstrip("%")) for row in rows) > 50

    # The work folder is made again for a checkpoint whose weights changed, not reused.
    changed = tmp_path / "changed"
    shutil.copytree(tiny_checkpoint, changed)
    model, tokenizer = load_checkpoint(changed)
    with torch.no_grad():
        model.output.weight.mul_(1.5)
    save_checkpoint(changed, model, tokenizer)
    flags[flags.index(str(tiny_checkpoint))] = str(changed)
    assert benchmark_main(flags) == 0
    manifest = json.loads((tmp_path / "default" / "onnx" / "manifest.json").read_text())
    assert manifest["checkpoint"]["weights_sha256"] == sha256(changed / "model.safetensors")
