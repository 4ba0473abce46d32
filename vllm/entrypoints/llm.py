"""LLM: the offline API. LLM(model=...).generate(prompts, sampling_params) -> RequestOutputs in
the order of the prompts; chat() applies the tokenizer's chat template first."""
import itertools
from typing import Any, Optional, Sequence, Union

from tqdm.auto import tqdm

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine, PromptType
from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams


class LLM:

    def __init__(self, model: str, tokenizer: Optional[str] = None, dtype: str = "auto",
                 seed: int = 0, tensor_parallel_size: int = 1, enforce_eager: bool = False,
                 gpu_memory_utilization: float = 0.9, **kwargs: Any) -> None:
        engine_args = EngineArgs(model=model, tokenizer=tokenizer, dtype=dtype, seed=seed,
                                 tensor_parallel_size=tensor_parallel_size,
                                 enforce_eager=enforce_eager,
                                 gpu_memory_utilization=gpu_memory_utilization, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(engine_args)
        self._counter = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.get_tokenizer()

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (list(sampling_params) if isinstance(sampling_params, (list, tuple))
                  else [sampling_params] * len(prompts))
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                request_id = str(next(self._counter))
                self.llm_engine.add_request(request_id, prompt, p)
                ids.append(request_id)
        except Exception:
            self.llm_engine.abort_request(ids)  # a bad prompt aborts this call's others
            raise
        return self._run_engine(ids, use_tqdm)

    def chat(self, messages: Union[list[dict], list[list[dict]]],
             sampling_params: Optional[Union[SamplingParams, list[SamplingParams]]] = None,
             use_tqdm: bool = True, chat_template: Optional[str] = None,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tokenizer = self.get_tokenizer()
        prompts = []
        for conversation in conversations:
            ids = tokenizer.apply_chat_template(conversation, chat_template=chat_template,
                                                add_generation_prompt=add_generation_prompt,
                                                tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            prompts.append({"prompt_token_ids": list(ids)})
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm)
        wanted = set(request_ids)
        while self.llm_engine.has_unfinished_requests() and len(finished) < len(wanted):
            for output in self.llm_engine.step():
                if output.finished and output.request_id in wanted:
                    finished[output.request_id] = output
                    bar.update(1)
        bar.close()
        return [finished[r] for r in request_ids]
