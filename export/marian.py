"""Export a checkpoint as a Hugging Face MarianMT folder: ``python -m export --format marian --out DIR``.

The folder loads with ``transformers.MarianMTModel`` / ``MarianTokenizer``. By default
(``--marian-layout opus-mt``) it follows OPUS-MT's conventions (<pad> last, a zero start
embedding), which CTranslate2's ``ct2-transformers-converter`` needs; ``--marian-layout ours``
keeps our ids and start token, for an exact round trip. The same fixed pipeline as the ONNX
export: load, validate (model.marian reports every unsupported option at once), write, check
parity by reading the written folder back, and only then move it into place.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from export.parity import FP32_TOLERANCE
from model.checkpoint import load_checkpoint, read_config
from model.folders import staged_folder
from model.marian import DEFAULT_LAYOUT, MarianError, in_opus_mt_layout, load_marian, opus_mt_order, save_marian
from model.transformer import Transformer
from model.translate import TorchTranslator
from runtime.batch import pad_sources


@torch.no_grad()
def logits_difference(
    a: Transformer, b: Transformer, sources: Sequence[Sequence[int]], order: torch.Tensor | None = None
) -> float:
    """Max abs difference of the two models' logits on sources, teacher-forced with a's greedy translations.

    ``order`` (b's id i is a's id order[i]) compares a model whose vocabulary was reordered; the logit of
    b's last id, <pad> in the OPUS-MT layout (its embedding zeroed, never generated), is left out."""
    outputs = TorchTranslator(a, None, max_output_tokens=32).translate_ids(sources)
    logits = []
    for model, to_model in ((a, None), (b, None if order is None else torch.argsort(order))):
        c = model.config
        ids = (
            sources if to_model is None else [to_model[torch.tensor(row, dtype=torch.long)].tolist() for row in sources]
        )
        src, mask = (torch.from_numpy(x) for x in pad_sources(ids, c.pad_id, c.eos_id))
        tgt = torch.full((len(sources), max(len(o) for o in outputs) + 1), c.pad_id)
        tgt[:, 0] = c.decoder_start_id
        for i, row in enumerate(outputs):
            row = torch.tensor(row, dtype=torch.long)
            tgt[i, 1 : len(row) + 1] = row if to_model is None else to_model[row]
        logits.append(model(src, mask, tgt))
    theirs = logits[1] if order is None else logits[1][..., :-1]
    ours = logits[0] if order is None else logits[0][..., order[:-1]]
    lengths = torch.tensor([len(o) + 1 for o in outputs])
    valid = torch.arange(logits[0].shape[1])[None, :] < lengths[:, None]  # steps past a row's end are padding
    return float((ours - theirs).abs().amax(-1)[valid].max())


def export_marian(checkpoint: Path, out: Path, sentences: Sequence[str], layout: str = DEFAULT_LAYOUT) -> Path:
    """Write checkpoint as a Marian folder at out, if reading it back gives the same logits on sentences."""
    model, tokenizer = load_checkpoint(checkpoint)
    config = read_config(checkpoint)
    reorder = layout == "opus-mt" and not in_opus_mt_layout(model.config)
    with staged_folder(out) as folder:
        languages = config.get("source_language", "en"), config.get("target_language", "de")
        save_marian(model, tokenizer, folder, *languages, layout=layout)
        order = opus_mt_order(model.config) if reorder else None
        difference = logits_difference(model, load_marian(folder)[0], tokenizer.encode_source(sentences), order)
        if difference > FP32_TOLERANCE:
            raise MarianError(f"parity failed: logits differ by {difference:.3g} after conversion; nothing was written")
    if not reorder and not in_opus_mt_layout(model.config):
        print(
            "note: CTranslate2's Marian converter needs <pad> last and a zero start embedding; "
            "the default --marian-layout opus-mt writes that",
            file=sys.stderr,
        )
    return out
