"""Export a checkpoint as a Hugging Face MarianMT folder: ``python -m export --format marian --out DIR``.

The folder loads with ``transformers.MarianMTModel`` / ``MarianTokenizer``; CTranslate2's
``ct2-transformers-converter`` reproduces it when it is in OPUS-MT's layout (see
``ctranslate2_note``). The same fixed pipeline as the ONNX export: load, validate (model.marian reports every unsupported option at once), write,
check parity by reading the written folder back, and only then move it into place.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from export.parity import FP32_TOLERANCE
from model.checkpoint import load_checkpoint, read_config
from model.marian import MarianError, load_marian, save_marian
from model.search import pad_sources
from model.transformer import Transformer
from model.translate import TorchTranslator


@torch.no_grad()
def logits_difference(a: Transformer, b: Transformer, sources: Sequence[Sequence[int]]) -> float:
    """Max abs difference of the two models' logits on sources, teacher-forced with a's greedy translations."""
    c = a.config
    src, mask = (torch.from_numpy(x) for x in pad_sources(sources, c.pad_id, c.eos_id))
    outputs = TorchTranslator(a, None, max_output_tokens=32).translate_ids(sources)
    longest = max(len(o) for o in outputs)
    tgt = torch.full((len(sources), longest + 1), c.pad_id)
    tgt[:, 0] = c.decoder_start_id
    for i, row in enumerate(outputs):
        tgt[i, 1 : len(row) + 1] = torch.tensor(row, dtype=torch.long)
    return float((a(src, mask, tgt) - b(src, mask, tgt)).abs().max())


def ctranslate2_note(model: Transformer) -> str | None:
    """Why CTranslate2's Marian converter, which assumes OPUS-MT's layout, would not reproduce this model."""
    c = model.config
    if c.pad_id != c.vocab_size - 1:
        return f"CTranslate2's Marian converter expects <pad> as the last id (it is {c.pad_id}) and will refuse this folder"
    if model.embedding.weight[c.decoder_start_id].any():
        return (
            f"CTranslate2 starts Marian decoders from a zero embedding, but this model starts from id "
            f"{c.decoder_start_id}, whose embedding is not zero: CTranslate2 would translate differently"
        )
    return None


def export_marian(checkpoint: Path, out: Path, sentences: Sequence[str]) -> Path:
    """Write checkpoint as a Marian folder at out, if reading it back gives the same logits on sentences."""
    model, tokenizer = load_checkpoint(checkpoint)
    config = read_config(checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.", ignore_cleanup_errors=True) as tmp:
        folder = Path(tmp) / "marian"
        save_marian(model, tokenizer, folder, config.get("source_language", "en"), config.get("target_language", "de"))
        difference = logits_difference(model, load_marian(folder)[0], tokenizer.encode_source(sentences))
        if difference > FP32_TOLERANCE:
            raise MarianError(f"parity failed: logits differ by {difference:.3g} after conversion; nothing was written")
        if out.exists():
            shutil.rmtree(out)
        folder.rename(out)
    if note := ctranslate2_note(model):
        print(f"note: {note}", file=sys.stderr)
    return out
