"""Incremental detokenization and the stop-string check (the stops at a token are the
Scheduler's). Text grows by decoding a short window of recent tokens (seeded with the prompt's
tail so leading spaces come out right) and holding back text that ends in an incomplete UTF-8
sequence."""
from typing import Any, Callable, Optional

from vllm.core.request import Request, RequestStatus

_PROMPT_TAIL = 5


def text_decoder(tokenizer: Any) -> Callable[..., str]:
    """tokenizer.decode, or the same decode of its Rust backend where transformers adds nothing
    to it (a fast tokenizer that does not clean up spaces): transformers' decode first walks the
    ids in Python (4.4 us against 0.7 for a six-token window, twice per request per step)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.decode
    return backend.decode


class Detokenizer:

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._decode = text_decoder(tokenizer)
        self._state: dict[str, tuple[list[int], int, int]] = {}  # ids, prefix_offset, read_offset

    def free(self, req: Request) -> None:
        """Forgets req; a finished request's held-back text (an incomplete UTF-8 tail) is
        appended first, unless a stop string cut the text."""
        state = self._state.pop(req.req_id, None)
        if (state is None or not req.is_finished or isinstance(req.stop_reason, str)
                or req.status == RequestStatus.FINISHED_ERROR):
            return
        ids, prefix_offset, read_offset = state
        if read_offset < len(ids):
            skip = req.sampling_params.skip_special_tokens
            prefix_text = self._decode(ids[prefix_offset:read_offset], skip_special_tokens=skip)
            full_text = self._decode(ids[prefix_offset:], skip_special_tokens=skip)
            req.output_text += full_text[len(prefix_text):]

    def decode_new_tokens(self, req: Request, new_ids: list[int]) -> str:
        """Appends the text of new_ids to req.output_text and returns it."""
        params = req.sampling_params
        if not params.detokenize:
            return ""
        ids, prefix_offset, read_offset = self._state.get(
            req.req_id, (req.prompt_token_ids[-_PROMPT_TAIL:], 0,
                         len(req.prompt_token_ids[-_PROMPT_TAIL:])))
        ids = ids + new_ids
        skip = params.skip_special_tokens
        prefix_text = self._decode(ids[prefix_offset:read_offset], skip_special_tokens=skip)
        full_text = self._decode(ids[prefix_offset:], skip_special_tokens=skip)
        delta = ""
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            delta = full_text[len(prefix_text):]
            prefix_offset, read_offset = read_offset, len(ids)
        # keep the window short: drop ids before prefix_offset
        ids, read_offset, prefix_offset = (ids[prefix_offset:], read_offset - prefix_offset, 0)
        self._state[req.req_id] = (ids, prefix_offset, read_offset)
        req.output_text += delta
        return delta


def check_stop_strings(req: Request, new_text: str) -> Optional[RequestStatus]:
    """Whether a stop string appeared in new_text (with the text before it); truncates
    output_text there and sets req.stop_reason."""
    params = req.sampling_params
    if not params.stop or not new_text or len(req.output_token_ids) < params.min_tokens:
        return None
    return _check_stop_strings(req, len(new_text))


def _check_stop_strings(req: Request, num_new_chars: int) -> Optional[RequestStatus]:
    text = req.output_text
    for stop in req.sampling_params.stop:
        # only a stop string that overlaps the new text can be new
        start = max(0, len(text) - num_new_chars - len(stop) + 1)
        idx = text.find(stop, start)
        if idx >= 0:
            end = idx + len(stop) if req.sampling_params.include_stop_str_in_output else idx
            req.output_text = text[:end]
            req.stop_reason = stop
            return RequestStatus.FINISHED_STOPPED
    return None
