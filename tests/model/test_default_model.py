"""The committed default models translate sentences of their domain sensibly: English→German, German→English."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sacrebleu

from model.checkpoint import DEFAULT_CHECKPOINT, DEFAULT_DE_EN_CHECKPOINT, load_checkpoint
from model.translate import TorchTranslator
from testkit.sentences import OWN_SENTENCES

ENGLISH = [en for en, _ in OWN_SENTENCES]
GERMAN = [de for _, de in OWN_SENTENCES]


@pytest.mark.parametrize(
    ("checkpoint", "sources", "references"),
    [(DEFAULT_CHECKPOINT, ENGLISH, GERMAN), (DEFAULT_DE_EN_CHECKPOINT, GERMAN, ENGLISH)],
    ids=["en-de", "de-en"],
)
def test_default_model_translates_own_sentences(checkpoint, sources: list[str], references: list[str]):
    model, tokenizer = load_checkpoint(checkpoint)
    hypotheses = TorchTranslator(model, tokenizer).translate(sources, beam=4)
    chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    assert chrf >= 55, list(zip(sources, hypotheses, strict=True))
    assert all(h and h != s for h, s in zip(hypotheses, sources, strict=True))


def test_translate_command_reads_stdin():
    result = subprocess.run(
        [sys.executable, "-m", "model.translate", "--beam", "2"],
        input="Two dogs are playing in the snow.\nA man is riding a bicycle.\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert "Hund" in lines[0] and "Mann" in lines[1]
