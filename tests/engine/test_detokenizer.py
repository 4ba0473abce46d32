"""The engine's text decoder (the tokenizer's Rust backend where transformers adds nothing to its
decode) gives the text tokenizer.decode gives: random windows of ids, special tokens among them,
with and without skipping them; and a tokenizer that cleans up spaces keeps transformers' own
decode."""
import random

import pytest
from transformers import AutoTokenizer

from vllm.engine.detokenizer import text_decoder


@pytest.mark.parametrize("skip", [True, False])
def test_text_decoder_equals_tokenizer_decode(tiny_llama, skip):
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    tok.clean_up_tokenization_spaces = False
    decode = text_decoder(tok)
    assert decode is not tok.decode  # the backend's: what this test compares
    rng = random.Random(0)
    special = [tok.bos_token_id, tok.eos_token_id]
    for _ in range(300):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 12))]
        if rng.random() < 0.3:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(special))
        assert decode(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)


def test_text_decoder_keeps_transformers_decode_when_it_cleans_up(tiny_llama):
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    tok.clean_up_tokenization_spaces = True
    assert text_decoder(tok) == tok.decode
