from __future__ import annotations

import numpy as np
import pytest
import torch

from model.transformer import Transformer
from model.translate import TorchTranslator
from runtime.batch import pad_sources
from runtime.tokenizer import Tokenizer


def test_causal_mask_hides_the_future(tiny_model: Transformer):
    torch.manual_seed(0)
    src = torch.randint(4, 50, (2, 7))
    mask = torch.ones_like(src, dtype=torch.bool)
    tgt = torch.randint(4, 50, (2, 9))
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, 50, (2, 4))
    with torch.no_grad():
        a, b = tiny_model(src, mask, tgt), tiny_model(src, mask, changed)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-6)
    assert not torch.allclose(a[:, 5:], b[:, 5:], atol=1e-3)


def test_padding_content_does_not_matter(tiny_model: Transformer):
    torch.manual_seed(0)
    src = torch.randint(4, 50, (2, 8))
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[0, 5:] = False
    other = src.clone()
    other[0, 5:] = torch.randint(4, 50, (3,))
    tgt = torch.randint(4, 50, (2, 4))
    with torch.no_grad():
        memory_a, memory_b = tiny_model.encode(src, mask), tiny_model.encode(other, mask)
        logits_a, logits_b = tiny_model(src, mask, tgt), tiny_model(other, mask, tgt)
    assert torch.allclose(memory_a[0, :5], memory_b[0, :5], atol=1e-6)
    assert torch.allclose(logits_a, logits_b, atol=1e-6)


def test_cached_steps_equal_full_decoding_with_rows_of_different_lengths(tiny_model: Transformer):
    """Rows start at different steps (a late row joins with an empty cache) yet every
    step's log-probs equal those of decoding the row's whole prefix at once."""
    torch.manual_seed(0)
    c = tiny_model.config
    src_np, mask_np = pad_sources([[5, 6, 7, 8, 9], [10, 11, 12]], c.pad_id, c.eos_id)
    src, mask = torch.from_numpy(src_np), torch.from_numpy(mask_np)
    targets = torch.randint(4, 50, (2, 6))
    targets[:, 0] = c.bos_id
    with torch.no_grad():
        memory = tiny_model.encode(src, mask)
        cross_k, cross_v = tiny_model.cross_kv(memory)
        full = torch.log_softmax(tiny_model.decode(targets, memory, mask), -1)
        past_k, past_v, cache_mask = tiny_model.empty_cache(2)
        lengths = torch.zeros(2, dtype=torch.long)
        for step in range(6):
            # Row 1 joins two steps late: until then it is fed padding and its slots stay invalid.
            active = torch.tensor([True, step >= 2])
            tokens = torch.where(active, targets[torch.arange(2), torch.clamp(lengths, max=5)], 0)
            log_probs, new_k, new_v = tiny_model.decode_step(
                tokens, lengths, past_k, past_v, cache_mask, cross_k, cross_v, mask, torch.arange(2)
            )
            for row in range(2):
                if active[row]:
                    assert torch.allclose(log_probs[row], full[row, lengths[row]], atol=1e-5)
            past_k, past_v = torch.cat([past_k, new_k], 3), torch.cat([past_v, new_v], 3)
            cache_mask = torch.cat([cache_mask, active[:, None]], 1)
            lengths = lengths + active.long()


@pytest.mark.parametrize("beam", [1, 3])
def test_translation_with_cache_equals_without(tiny_model: Transformer, beam: int):
    tokenizer = Tokenizer.__new__(Tokenizer)  # ids only: the tokenizer is not used here
    translator = TorchTranslator(tiny_model, tokenizer, max_output_tokens=12)
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, 50, size=n).tolist() for n in (3, 9, 5, 1)]
    cached = translator.translate_ids(sources, beam=beam, use_cache=True)
    uncached = translator.translate_ids(sources, beam=beam, use_cache=False)
    assert cached == uncached
    assert any(len(out) > 0 for out in cached)
