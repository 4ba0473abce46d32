"""StreamDetokenizer: the text of outputs made where they arrive, in the API server's process,
so that the engine core spends its time on steps. The core sends token ids; a request the core
must read as text (one with stop strings, which end it at a text match) still comes with its text
from the core, and is left as it is here.

Per request (and per completion of an n > 1 request) it keeps the same incremental state as the
engine's Detokenizer, fed with the token ids each output adds; a finished completion gets its
held-back tail (an incomplete UTF-8 sequence) as the engine would give it."""
from typing import Any, Optional

from vllm.core.request import RequestStatus
from vllm.engine.detokenizer import Detokenizer
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams

_STATUS = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH_CAPPED,
           "abort": RequestStatus.FINISHED_ABORTED, "error": RequestStatus.FINISHED_ERROR}


class _Completion:
    """What Detokenizer reads and writes of a Request, for one completion."""

    def __init__(self, req_id: str, prompt_token_ids: list[int],
                 params: SamplingParams) -> None:
        self.req_id = req_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = params
        self.num_tokens_seen = 0
        self.output_text = ""
        self.status = RequestStatus.RUNNING
        self.stop_reason: Any = None

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished


def text_in_engine(params: SamplingParams) -> bool:
    """Whether the engine core must make this request's text itself (to find its stop strings)."""
    return bool(params.stop)


class StreamDetokenizer:

    def __init__(self, tokenizer: Any) -> None:
        self.detokenizer = Detokenizer(tokenizer)
        self._params: dict[str, SamplingParams] = {}
        self._completions: dict[str, dict[int, _Completion]] = {}

    def add(self, request_id: str, params: SamplingParams) -> None:
        if not text_in_engine(params):
            self._params[request_id] = params
            self._completions[request_id] = {}

    def free(self, request_id: str) -> None:
        self._params.pop(request_id, None)
        for c in self._completions.pop(request_id, {}).values():
            self.detokenizer.free(c)  # c is unfinished here: only its state is dropped

    def process(self, output: RequestOutput) -> None:
        """Fills in the text of output's completions (cumulative, as the engine would); frees
        the request once the output is its last."""
        params = self._params.get(output.request_id)
        if params is None:
            return
        completions = self._completions[output.request_id]
        for out in output.outputs:
            c = completions.get(out.index)
            if c is None:
                c = completions[out.index] = _Completion(f"{output.request_id}#{out.index}",
                                                         output.prompt_token_ids, params)
            self._advance(c, out)
        if output.finished:
            self._params.pop(output.request_id, None)
            self._completions.pop(output.request_id, None)

    def _advance(self, c: _Completion, out: CompletionOutput) -> None:
        new_ids = out.token_ids[c.num_tokens_seen:]
        if new_ids:
            self.detokenizer.decode_new_tokens(c, new_ids)
            c.num_tokens_seen = len(out.token_ids)
        status: Optional[RequestStatus] = _STATUS.get(out.finish_reason)
        if status is not None and not c.is_finished:
            c.status, c.stop_reason = status, out.stop_reason
            self.detokenizer.free(c)  # appends a held-back tail
        out.text = c.output_text
