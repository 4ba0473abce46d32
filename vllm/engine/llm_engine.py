"""LLMEngine: requests in, RequestOutputs out, one step at a time.

What a request passes through, who owns it, and where it lives:

  add_request(prompt, SamplingParams)      caller -> engine; CPU
    tokenizer                              text -> prompt_token_ids (CPU)
    Request                                owned by the Scheduler while unfinished (CPU): token
                                           ids, KV block ids, progress, outputs
  step()
    1. Scheduler.schedule()                -> SchedulerOutput (CPU): which requests run, how
                                           many tokens each; BlockManager hands out KV blocks
    2. Executor.execute_model()            ModelRunner builds the batch on the host, copies it
                                           to the model's device (GPU or CPU), runs the forward
                                           over the paged KV cache (device memory), samples
                                           (device), returns token ids (CPU); with tensor
                                           parallelism on every rank's Worker, rank 0 samples
    3. Scheduler.update()                  appends tokens up to the first that ends its request
                                           (eos, stop token ids, max_tokens, max_model_len),
                                           advances num_computed_tokens (CPU)
    4. Detokenizer + check_stop_strings()  text grows, stop strings end requests too; finished
                                           requests' KV blocks go back to the BlockManager (in
                                           an engine core process only requests with stop
                                           strings get text here; the API server's
                                           StreamDetokenizer makes the rest)
    5. RequestOutput                       engine -> caller (CPU)

With speculative decoding (speculative_model set; SpecDecoder owns all of it) a step becomes:
    0. SpecDecoder.plan() -> k             the goodput controller's k for this step (0: plain),
                                           and whether to split the batch (batched overlap)
    1. Scheduler.schedule(k)               also reserves k KV slots past each decoding request;
                                           in a split step the resting half sits out
    1b. Proposer.propose() -> handle       drafts (n-gram lookup, or the draft model on its own
                                           device: the CPU with cpu_draft_worker, its own KV,
                                           in its own process beside a GPU target:
                                           spec_decode/draft_process.py); the engine waits on
                                           the handle only here. A split step takes the drafts
                                           made during the previous step and sends the resting
                                           half to be drafted during this one
    2. Worker.execute_model()              ONE target forward over [last token, d1..dk] per
                                           request; RejectionSampler keeps a prefix of the
                                           drafts and adds one target token (lossless)
    3. Scheduler.update()                  KV of rejected drafts is dropped (num_computed)
    3b. Proposer.accept()                  the draft rolls its KV back to the accepted prefix

n > 1 fans a request out into n child requests (ids "<id>#<i>") whose outputs are merged.
"""
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from vllm.config import VllmConfig
from vllm.core.block_manager import BlockManager
from vllm.core.request import Request, RequestStatus
from vllm.core.scheduler import Appended, Scheduler, SchedulerOutput
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.detokenizer import Detokenizer, check_stop_strings
from vllm.engine.step_timer import StepTimer
from vllm.engine.stream_detokenizer import text_in_engine
from vllm.engine.tokenizer import get_tokenizer
from vllm.executor.executor_base import create_executor
from vllm.logger import init_logger
from vllm.model_executor.sampler import LogprobsTensors
from vllm.model_executor.model_loader.loader import resolve_config
from vllm.outputs import CompletionOutput, Logprob, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.spec_decode.metrics import SpecDecodeMetrics
from vllm.spec_decode.proposer import Proposer
from vllm.spec_decode.spec_decoder import SpecDecoder
from vllm.worker.model_runner import RunnerOutput

logger = init_logger(__name__)

PromptType = Union[str, dict]


@dataclass
class _RequestGroup:
    """The caller's request: its n child requests and the outputs built so far."""
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    children: list[Request] = field(default_factory=list)


class LLMEngine:

    def __init__(self, config: VllmConfig) -> None:
        self.config = resolve_config(config)
        mc = config.model_config
        torch.manual_seed(mc.seed)
        self.tokenizer = get_tokenizer(mc)
        self.model_executor = create_executor(config)
        self.worker = self.model_executor.driver_worker  # rank 0's, for inspection
        self.model_executor.load_model()
        num_blocks = self.model_executor.initialize_cache()
        self.block_manager = BlockManager(num_blocks, config.cache_config.block_size)
        self.scheduler = Scheduler(config.scheduler_config, self.block_manager, mc.max_model_len)
        self.detokenizer = Detokenizer(self.tokenizer)
        # False in an engine core process: only requests with stop strings get their text here,
        # the API server detokenizes the rest (vllm/engine/stream_detokenizer.py)
        self.detokenize_all = True
        self.groups: dict[str, _RequestGroup] = {}
        self.eos_token_id = self.tokenizer.eos_token_id
        self.spec_config = config.speculative_config
        self.spec = SpecDecoder(self.config, self.tokenizer)
        self.step_timer = StepTimer()

    @property
    def proposer(self) -> Optional[Proposer]:
        return self.spec.proposer

    @proposer.setter
    def proposer(self, proposer: Optional[Proposer]) -> None:
        self.spec.proposer = proposer

    @property
    def spec_metrics(self) -> SpecDecodeMetrics:
        return self.spec.metrics

    @spec_metrics.setter
    def spec_metrics(self, metrics: SpecDecodeMetrics) -> None:
        self.spec.metrics = metrics

    @property
    def draft_ahead(self) -> bool:
        return self.spec.draft_ahead

    @draft_ahead.setter
    def draft_ahead(self, on: bool) -> None:
        self.spec.draft_ahead = on

    def shutdown(self) -> None:
        """Stops the processes this engine started (the draft process, tensor-parallel ranks)."""
        self.spec.shutdown()
        self.model_executor.shutdown()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        return cls(engine_args.create_engine_config())

    @property
    def max_model_len(self) -> int:
        return self.config.model_config.max_model_len

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    # requests in

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                    arrival_time: Optional[float] = None) -> None:
        """Validates and queues a request; a bad one raises ValueError and changes nothing."""
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be SamplingParams, got {type(params)}")
        text, token_ids = self._tokenize(prompt)
        self._validate_length(request_id, token_ids, params)
        group = _RequestGroup(request_id, text, token_ids)
        for i in range(params.n):
            child_params = params.clone()
            child_params.n = 1
            if params.seed is not None:
                child_params.seed = params.seed + i
            child_id = request_id if params.n == 1 else f"{request_id}#{i}"
            generator = None
            if child_params.seed is not None:
                generator = torch.Generator(self.config.device).manual_seed(child_params.seed)
            child = Request(child_id, text, token_ids, child_params, self.eos_token_id,
                            arrival_time, generator)
            child.group_id = request_id
            group.children.append(child)
        for child in group.children:
            self.scheduler.add_request(child)
        self.groups[request_id] = group

    def _tokenize(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, str):
            return prompt, self._encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = list(prompt["prompt_token_ids"])
            vocab = self.config.hf_config.vocab_size
            bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt_token_ids hold ids outside the vocabulary [0, {vocab}): "
                                 f"{bad[:5]}")
            return prompt.get("prompt"), ids
        if isinstance(prompt, dict) and "prompt" in prompt:
            return prompt["prompt"], self._encode(prompt["prompt"])
        raise ValueError("a prompt is a string or a dict with 'prompt' or 'prompt_token_ids', "
                         f"got {type(prompt).__name__}")

    def _encode(self, text: Any) -> list[int]:
        """The tokenizer's ids of text; whatever the tokenizer raises (some raise TypeError or
        a Rust panic on text they cannot handle) becomes a ValueError naming it."""
        if not isinstance(text, str):
            raise ValueError(f"a prompt must be a string, got {type(text).__name__}")
        try:
            return list(self.tokenizer.encode(text))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - pyo3's PanicException is a BaseException
            raise ValueError(f"the tokenizer rejected the prompt: {type(e).__name__}: {e}") from e

    def _validate_length(self, request_id: str, token_ids: list[int],
                         params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError(f"request {request_id!r} has an empty prompt")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(f"request {request_id!r}: the prompt has {len(token_ids)} tokens; "
                             f"max_model_len is {self.max_model_len} (room for at least one "
                             "generated token is needed)")
        max_logprobs = self.config.model_config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > max_logprobs:
                raise ValueError(f"request {request_id!r}: {name}={value} is more than "
                                 f"max_logprobs={max_logprobs} (--max-logprobs)")
        if params.prompt_logprobs is not None and (
                len(token_ids) > self.config.scheduler_config.max_num_batched_tokens):
            raise ValueError(f"request {request_id!r}: prompt_logprobs needs the whole prompt "
                             "in one step; it is longer than max_num_batched_tokens")

    def abort_request(self, request_id: Union[str, list[str]]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            group = self.groups.pop(rid, None)
            if group is None:
                continue
            self.scheduler.abort_requests([c.req_id for c in group.children])
            for child in group.children:
                self.detokenizer.free(child)
            self.spec.free(group.children)

    def stats(self) -> "EngineStats":
        from vllm.engine.engine_client import EngineStats

        return EngineStats(num_running=len(self.scheduler.running),
                           num_waiting=len(self.scheduler.waiting),
                           kv_cache_usage=self.block_manager.usage, spec_decode=self.spec.stats(),
                           step_times=self.step_timer.as_dict())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.groups)

    # one step

    def step(self) -> list[RequestOutput]:
        """Runs one step. It does not raise because of a request: a fault while handling one
        request (sampling it, detokenizing, a stop check, formatting its logprobs) finishes that
        request with RequestOutput.error set; a fault of the step as a whole (the forward)
        fails the requests of this step the same way, and later steps serve the rest."""
        self.step_timer.begin()
        k = self.spec.plan(self.scheduler.running)
        sched_out = self.scheduler.schedule(k, [r.req_id for r in self.spec.resting])
        if sched_out.is_empty():
            return []
        self.step_timer.mark("schedule")
        prefill = any(n > 1 + len(d) for n, d in zip(sched_out.num_scheduled_tokens,
                                                     sched_out.draft_token_ids))
        try:
            outputs = self._run_step(sched_out)
            self.step_timer.end("prefill" if prefill else "decode")
            return outputs
        except Exception as e:  # noqa: BLE001 - the step's requests hear of it, not the caller
            logger.exception("a step failed; failing its %d requests", len(sched_out.requests))
            message = f"the engine step failed: {type(e).__name__}: {e}"
            failed = {req.group_id: message for req in sched_out.requests}
            return self._fail_groups(failed)

    def _run_step(self, sched_out: SchedulerOutput) -> list[RequestOutput]:
        timer = self.step_timer
        speculating = self.spec.propose(sched_out)
        timer.mark("propose")
        start = time.perf_counter()
        result = self.model_executor.execute_model(sched_out, self.spec.ahead_hook(speculating))
        timer.mark("execute")
        appended = self.scheduler.update(sched_out, result.sampled)
        self.spec.verified(sched_out, result.sampled, time.perf_counter() - start)
        timer.mark("update")
        outputs = self._make_step_outputs(sched_out, result, appended)
        self.spec.end_step(sched_out, appended)
        timer.mark("outputs")
        return outputs

    def _make_step_outputs(self, sched_out: SchedulerOutput, result: RunnerOutput,
                           appended: list[Optional[Appended]]) -> list[RequestOutput]:
        """Text, stop strings and logprobs of what the step appended; finished requests freed;
        the callers' outputs."""
        # group id -> why it failed: those groups are finished with an error below
        failed = {sched_out.requests[i].group_id: msg for i, msg in result.failed.items()}
        self._record_logprobs(sched_out.requests, result, failed)
        touched: dict[str, None] = {}
        now = time.time()
        for i, (req, drafts, new_ids, kept) in enumerate(zip(
                sched_out.requests, sched_out.draft_token_ids, result.sampled, appended)):
            if kept is None or req.is_finished or req.group_id in failed:
                continue
            try:
                self._process_new_tokens(req, i, drafts, new_ids, kept, result, now)
            except Exception as e:  # noqa: BLE001 - this request alone fails
                logger.exception("request %s failed", req.group_id)
                failed[req.group_id] = f"{type(e).__name__}: {e}"
            touched[req.group_id] = None
        outputs = []
        for g in touched:
            if g in self.groups and g not in failed:
                try:
                    outputs.append(self._make_output(self.groups[g]))
                except Exception as e:  # noqa: BLE001 - this request alone fails
                    logger.exception("request %s failed", g)
                    failed[g] = f"{type(e).__name__}: {e}"
        for output in outputs:
            if output.finished:
                del self.groups[output.request_id]
        return outputs + self._fail_groups(failed)

    def _process_new_tokens(self, req: Request, i: int, drafts: list[int], new_ids: list[int],
                            kept: Appended, result: RunnerOutput, now: float) -> None:
        """Text, stop strings, logprobs and speculation counts of the tokens req just got (the
        scheduler kept the first kept.num_kept of new_ids); finishes req if it ended."""
        if req.first_token_time is None:
            req.first_token_time = now
            self.step_timer.first_token(now - req.arrival_time)
        num_kept = kept.num_kept
        status = self._grow_text(req, new_ids[:num_kept]) or kept.status
        if i in result.token_logprobs and req.logprobs is not None:
            entries = self._logprob_entries(result.token_logprobs[i],
                                            [req.sampling_params.logprobs] * num_kept)
            req.logprobs.extend(entries[:num_kept])
        if drafts:
            self.spec.record_emitted(req, len(drafts), new_ids, num_kept)
        if status is not None:
            self.scheduler.finish_request(req, status)
            self.detokenizer.free(req)
            self.spec.free([req])

    def _fail_groups(self, failed: dict[str, str]) -> list[RequestOutput]:
        """Finishes every child of each group with its error and frees what they held; returns
        the groups' final outputs (error set)."""
        outputs = []
        for group_id, message in failed.items():
            group = self.groups.pop(group_id, None)
            if group is None:
                continue
            for child in group.children:
                if not child.is_finished:
                    self.scheduler.finish_request(child, RequestStatus.FINISHED_ERROR)
                    child.error = message
                self.detokenizer.free(child)
                self.spec.free([child])
            try:
                output = self._make_output(group)
            except Exception:  # noqa: BLE001 - the error alone is reported then
                output = RequestOutput(group.request_id, group.prompt, group.prompt_token_ids,
                                       None, [], True)
            output.finished, output.error = True, message
            outputs.append(output)
        return outputs

    def _grow_text(self, req: Request, kept_ids: list[int]) -> Optional[RequestStatus]:
        """Grows req's text by the tokens it kept and checks its stop strings (FINISHED_STOPPED
        when one appeared, else None)."""
        if not (self.detokenize_all or text_in_engine(req.sampling_params)):
            return None  # the caller makes the text (StreamDetokenizer)
        new_text = self.detokenizer.decode_new_tokens(req, kept_ids)
        return check_stop_strings(req, new_text)

    def _logprob_entry(self, ids: list[int], lps: list[float], rank: int,
                       num: int) -> dict[int, Logprob]:
        """The chosen token (ids[0], its rank) first, then the top-num tokens by rank."""
        entry = {ids[0]: Logprob(lps[0], rank)}
        for r, (tid, lp) in enumerate(zip(ids[1:num + 1], lps[1:num + 1]), start=1):
            entry.setdefault(tid, Logprob(lp, r))
        for tid, lp in entry.items():
            lp.decoded_token = self.tokenizer.decode([tid])
        return entry

    def _logprob_entries(self, lt: LogprobsTensors, nums: list[int]) -> list[dict[int, Logprob]]:
        rows = zip(lt.logprob_token_ids.tolist(), lt.logprobs.tolist(),
                   lt.selected_token_ranks.tolist(), nums)
        return [self._logprob_entry(ids, lps, rank, num) for ids, lps, rank, num in rows]

    def _record_logprobs(self, reqs: list[Request], result: RunnerOutput,
                         failed: dict[str, str]) -> None:
        """Prompt and sample logprobs of the step; a request whose formatting fails is added
        to failed."""
        for i, lt in result.prompt_logprobs.items():
            req = reqs[i]
            num = req.sampling_params.prompt_logprobs
            try:
                req.prompt_logprobs = [None] + self._logprob_entries(lt,
                                                                     [num] * len(lt.logprobs))
            except Exception as e:  # noqa: BLE001 - this request alone fails
                logger.exception("request %s failed", req.group_id)
                failed.setdefault(req.group_id, f"{type(e).__name__}: {e}")
        so = result.sampler_output
        if so is None or so.logprobs is None:
            return
        lt = so.logprobs
        rows = zip(result.sampling_requests, lt.logprob_token_ids.tolist(), lt.logprobs.tolist(),
                   lt.selected_token_ranks.tolist())
        for i, ids, lps, rank in rows:
            req = reqs[i]
            if req.logprobs is None or req.group_id in failed:
                continue
            try:
                req.logprobs.append(self._logprob_entry(ids, lps, rank,
                                                        req.sampling_params.logprobs))
            except Exception as e:  # noqa: BLE001 - this request alone fails
                logger.exception("request %s failed", req.group_id)
                failed.setdefault(req.group_id, f"{type(e).__name__}: {e}")

    def _make_output(self, group: _RequestGroup) -> RequestOutput:
        outputs = []
        for i, req in enumerate(group.children):
            cumulative = None
            if req.logprobs is not None:
                cumulative = sum(e[t].logprob for e, t in zip(req.logprobs, req.output_token_ids))
            outputs.append(CompletionOutput(
                index=i, text=req.output_text, token_ids=list(req.output_token_ids),
                cumulative_logprob=cumulative, logprobs=req.logprobs,
                finish_reason=req.status.finish_reason, stop_reason=req.stop_reason))
        first = group.children[0]
        metrics = {"arrival_time": first.arrival_time, "first_token_time": first.first_token_time,
                   "num_preemptions": sum(c.num_preemptions for c in group.children)}
        spec = [c.metrics["spec_decode"] for c in group.children if "spec_decode" in c.metrics]
        if spec:
            total = spec[0]
            if len(spec) > 1:  # n > 1: the children's counts added up
                total = SpecDecodeMetrics()
                for m in spec:
                    for key, value in vars(m).items():
                        setattr(total, key, getattr(total, key) + value)
            metrics["spec_decode"] = total.as_dict(self.spec_config.num_speculative_tokens)
        return RequestOutput(
            request_id=group.request_id, prompt=group.prompt,
            prompt_token_ids=group.prompt_token_ids, prompt_logprobs=first.prompt_logprobs,
            outputs=outputs, finished=all(c.is_finished for c in group.children),
            metrics=metrics, error=next((c.error for c in group.children if c.error), None))
