"""The committed default model translates sentences of its domain into sensible German."""

from __future__ import annotations

import subprocess
import sys

import sacrebleu

from model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
from model.translate import TorchTranslator
from tests.conftest import OWN_SENTENCES

SOURCES = [en for en, _ in OWN_SENTENCES]
REFERENCES = [de for _, de in OWN_SENTENCES]


def test_default_model_translates_own_sentences():
    model, tokenizer = load_checkpoint(DEFAULT_CHECKPOINT)
    hypotheses = TorchTranslator(model, tokenizer).translate(SOURCES, beam=4)
    chrf = sacrebleu.corpus_chrf(hypotheses, [REFERENCES]).score
    assert chrf >= 55, list(zip(SOURCES, hypotheses, strict=True))
    assert all(h and h != s for h, s in zip(hypotheses, SOURCES, strict=True))


def test_translate_command_reads_stdin():
    result = subprocess.run(
        [sys.executable, "-m", "model.translate", "--beam", "2"],
        input="Two dogs are playing in the snow.\nA man is riding a bicycle.\n",
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert "Hund" in lines[0] and "Mann" in lines[1]
