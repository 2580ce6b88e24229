"""The running batch (runtime/batch.py): sources join mid-way and leave early without changing any result."""

from __future__ import annotations

import pytest
import torch

from model.transformer import Transformer
from model.translate import TorchTranslator
from runtime.batch import DecodeBatch
from runtime.search import default_max_output
from testkit.arrivals import decode_arriving
from tests.runtime.torch_steps import SOURCES, encode, torch_batch


@pytest.mark.parametrize("beam", [1, 3])
def test_joining_and_leaving_do_not_change_translations(tiny_model: Transformer, beam: int):
    translator = TorchTranslator(tiny_model, tokenizer=None, max_output_tokens=12)
    alone = [translator.translate_ids([s], beam)[0] for s in SOURCES]
    arrivals = {0: [0], 2: [1, 2], 3: [3], 6: [4]}  # step -> sources joining then

    def rows_agree(batch: DecodeBatch) -> None:
        rows = batch.layout
        assert rows.cache.rows == batch.rows == len(rows.source_index) == len(rows.tokens)

    with torch.inference_mode():
        decoded = decode_arriving(
            torch_batch(tiny_model, translator),
            {step: [(key, beam) for key in keys] for step, keys in arrivals.items()},
            lambda keys: encode(tiny_model, [SOURCES[key] for key in keys]),
            lambda key: default_max_output(len(SOURCES[key]), 12),
            stepped=rows_agree,
        )
    assert decoded.tokens(range(len(SOURCES))) == alone
