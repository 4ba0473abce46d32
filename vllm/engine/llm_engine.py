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
    3. Scheduler.update()                  appends tokens, advances num_computed_tokens (CPU)
    4. Detokenizer + check_stop()          text grows, stop conditions end requests; finished
                                           requests' KV blocks go back to the BlockManager
    5. RequestOutput                       engine -> caller (CPU)

With speculative decoding (speculative_model set) a step becomes:
    1. Scheduler.schedule(k)               also reserves k KV slots past each decoding request
    1b. Proposer.propose() -> handle       drafts (n-gram lookup, or the draft model on its own
                                           device: the CPU with cpu_draft_worker, its own KV,
                                           in its own process beside a GPU target:
                                           spec_decode/draft_process.py); the engine waits on
                                           the handle only here
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
from vllm.core.scheduler import Scheduler, SchedulerOutput
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.detokenizer import Detokenizer, check_stop_strings, check_token_stop
from vllm.engine.tokenizer import get_tokenizer
from vllm.executor.executor_base import create_executor
from vllm.logger import init_logger
from vllm.model_executor.sampler import LogprobsTensors
from vllm.model_executor.model_loader.loader import resolve_config
from vllm.outputs import CompletionOutput, Logprob, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.spec_decode.governor import SpecGovernor
from vllm.spec_decode.metrics import SpecDecodeMetrics
from vllm.spec_decode.ngram_proposer import NgramProposer
from vllm.spec_decode.proposer import Proposer
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
        self.groups: dict[str, _RequestGroup] = {}
        self.eos_token_id = self.tokenizer.eos_token_id
        self.spec_config = config.speculative_config
        self.proposer = self._create_proposer() if self.spec_config.enabled else None
        self.draft_ahead = self._draft_ahead()
        if self.proposer is not None:
            self.proposer.draft_ahead = self.draft_ahead
        self.governor = (SpecGovernor() if self.proposer is not None
                         and self.spec_config.speculative_adaptive == "on" else None)
        self.spec_metrics = SpecDecodeMetrics()
        self._last_log_time = time.time()

    def _create_proposer(self) -> Proposer:
        spec = self.spec_config
        if spec.is_ngram:
            return NgramProposer(spec.ngram_prompt_lookup_max, spec.ngram_prompt_lookup_min)
        if self._use_draft_process():
            from vllm.spec_decode.draft_process import DraftProcessProposer
            return DraftProcessProposer(self.config)
        from vllm.spec_decode.draft_worker import DraftModelProposer
        return DraftModelProposer(self.config, self.tokenizer)

    def _use_draft_process(self) -> bool:
        """A CPU draft runs in its own process when asked to, or (auto) beside a GPU target."""
        spec = self.spec_config
        draft_on_cpu = spec.cpu_draft_worker or self.config.device.type == "cpu"
        if spec.speculative_draft_process == "on" and not draft_on_cpu:
            raise ValueError("speculative_draft_process=on runs a CPU draft: add "
                             "cpu_draft_worker=True")
        if spec.speculative_draft_process == "auto":
            return draft_on_cpu and self.config.device.type != "cpu"
        return spec.speculative_draft_process == "on"

    def _draft_ahead(self) -> bool:
        """Drafting ahead pays when it overlaps the target's forward: the draft on another
        device (the CPU) than the target (the GPU), in the engine's process. 'on' forces it
        (tests on the CPU). A draft process is left to draft on demand: measured on the H200
        (trained 7B-shape pair, k=3), drafting ahead there made each proposal wait for the
        ahead work (draft 4.7 vs 3.0 ms per step, 1.82x vs 2.20x plain)."""
        mode = self.spec_config.speculative_draft_ahead
        draft_config = getattr(self.proposer, "config", None)
        if self.proposer is None or mode == "off" or draft_config is None:
            return False
        return mode == "on" or (draft_config.device.type != self.config.device.type
                                and not self.proposer.runs_in_own_process)

    def shutdown(self) -> None:
        """Stops the processes this engine started (the draft process, tensor-parallel ranks)."""
        if self.proposer is not None:
            self.proposer.shutdown()
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
                if self.proposer is not None:
                    self.proposer.free(child.req_id)

    def stats(self) -> "EngineStats":
        from vllm.engine.engine_client import EngineStats

        spec = None
        if self.spec_config.enabled:
            spec = self.spec_metrics.as_dict(self.spec_config.num_speculative_tokens)
            for key in ("num_restarts", "num_failures"):
                if hasattr(self.proposer, key):
                    spec[f"drafter_{key}"] = getattr(self.proposer, key)
        return EngineStats(num_running=len(self.scheduler.running),
                           num_waiting=len(self.scheduler.waiting),
                           kv_cache_usage=self.block_manager.usage, spec_decode=spec)

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
        num_lookahead = self._num_lookahead()
        sched_out = self.scheduler.schedule(num_lookahead)
        if sched_out.is_empty():
            return []
        try:
            return self._run_step(sched_out, num_lookahead)
        except Exception as e:  # noqa: BLE001 - the step's requests hear of it, not the caller
            logger.exception("a step failed; failing its %d requests", len(sched_out.requests))
            message = f"the engine step failed: {type(e).__name__}: {e}"
            failed = {req.group_id: message for req in sched_out.requests}
            return self._fail_groups(failed)

    def _run_step(self, sched_out: SchedulerOutput, num_lookahead: int) -> list[RequestOutput]:
        step_start = time.perf_counter()
        speculating = num_lookahead > 0 and self._propose(sched_out)
        start = time.perf_counter()
        ahead = self._propose_ahead if speculating and self.draft_ahead else None
        result = self.model_executor.execute_model(sched_out, ahead)
        self.scheduler.update(sched_out, result.sampled)
        # group id -> why it failed: those groups are finished with an error below
        failed = {sched_out.requests[i].group_id: msg for i, msg in result.failed.items()}
        if speculating:
            self._accept_drafts(sched_out, result, time.perf_counter() - start)
        if self.governor is not None:
            self._inform_governor(sched_out, result, speculating,
                                  1e3 * (time.perf_counter() - step_start))
        self._record_logprobs(sched_out.requests, result, failed)
        touched: dict[str, None] = {}
        now = time.time()
        for i, (req, drafts, new_ids) in enumerate(zip(sched_out.requests,
                                                       sched_out.draft_token_ids, result.sampled)):
            if not new_ids or req.is_finished or req.group_id in failed:
                continue
            try:
                self._process_new_tokens(req, i, drafts, new_ids, result, now)
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
                            result: RunnerOutput, now: float) -> None:
        """Stop checks, text, logprobs and speculation counts of the tokens req just got."""
        if req.first_token_time is None:
            req.first_token_time = now
        status, num_kept = self._append_checked(req, new_ids)
        if i in result.token_logprobs and req.logprobs is not None:
            entries = self._logprob_entries(result.token_logprobs[i],
                                            [req.sampling_params.logprobs] * num_kept)
            req.logprobs.extend(entries[:num_kept])
        if drafts:
            self._record_spec_step(req, len(drafts), new_ids, num_kept)
        if status is not None:
            self.scheduler.finish_request(req, status)
            self.detokenizer.free(req)
            if self.proposer is not None:
                self.proposer.free(req.req_id)

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
                self._free_proposer_state([child])
            try:
                output = self._make_output(group)
            except Exception:  # noqa: BLE001 - the error alone is reported then
                output = RequestOutput(group.request_id, group.prompt, group.prompt_token_ids,
                                       None, [], True)
            output.finished, output.error = True, message
            outputs.append(output)
        return outputs

    # speculative decoding

    def _num_lookahead(self) -> int:
        """k, or 0 when speculation is off for this step (by batch size, or by the governor)."""
        spec = self.spec_config
        if self.proposer is None:
            return 0
        running = self.scheduler.running
        if (spec.speculative_disable_by_batch_size is not None
                and len(running) >= spec.speculative_disable_by_batch_size):
            return 0
        # seeded requests must come out the same on every run: timing may not change their
        # schedule of speculation
        if (self.governor is not None and not any(r.sampling_params.seed is not None
                                                  for r in running)
                and not self.governor.should_speculate()):
            return 0
        return spec.num_speculative_tokens

    def _inform_governor(self, out: SchedulerOutput, result: RunnerOutput, speculating: bool,
                         step_ms: float) -> None:
        """Decode-only steps (every sequence brings its last token, plus drafts) tell the
        governor what a plain or a speculative token costs."""
        drafts = out.draft_token_ids or [[] for _ in out.requests]
        if not all(n == 1 + len(d) for n, d in zip(out.num_scheduled_tokens, drafts)):
            return  # a prompt (chunk) is in the step
        if speculating:
            self.governor.record_spec(step_ms, sum(len(s or ()) for s in result.sampled))
        elif self.proposer is not None:
            self.governor.record_plain(step_ms, len(out.requests))

    def _propose(self, out: SchedulerOutput) -> bool:
        """Asks the proposer for drafts into the reserved lookahead slots; False if none came."""
        start = time.perf_counter()
        idx = [i for i, n in enumerate(out.num_lookahead) if n > 0]
        if not idx:
            return False
        reqs = [out.requests[i] for i in idx]
        try:
            proposal = self.proposer.propose(reqs, [out.num_lookahead[i] for i in idx]).result()
            self._check_proposal(proposal, len(idx))
        except Exception:  # noqa: BLE001 - the step goes on without speculation
            logger.exception("the proposer failed; this step runs without speculation")
            self._free_proposer_state(reqs)
            return False
        for i, drafts, probs in zip(idx, proposal.draft_token_ids, proposal.draft_probs):
            drafts = drafts[:out.num_lookahead[i]]
            out.draft_token_ids[i] = drafts
            out.num_scheduled_tokens[i] += len(drafts)
            if probs is not None and drafts:
                out.draft_probs[i] = probs[:len(drafts)]
        self.spec_metrics.draft_time_s += time.perf_counter() - start
        self.spec_metrics.num_propose_calls += 1
        return any(out.draft_token_ids[i] for i in idx)

    def _check_proposal(self, proposal: Any, num_requests: int) -> None:
        vocab = self.config.hf_config.vocab_size
        if (len(proposal.draft_token_ids) != num_requests
                or len(proposal.draft_probs) != num_requests):
            raise ValueError(f"the proposal has {len(proposal.draft_token_ids)} entries for "
                             f"{num_requests} requests")
        for drafts in proposal.draft_token_ids:
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in drafts):
                raise ValueError(f"the proposal holds token ids outside [0, {vocab}): {drafts}")

    def _propose_ahead(self) -> None:
        """The proposer drafting ahead during the verification; if it fails, the drafters of
        the running requests start over (the verification itself is unaffected)."""
        try:
            self.proposer.propose_ahead()
        except Exception:  # noqa: BLE001 - speculation is an optimisation
            logger.exception("the proposer failed drafting ahead; its state is reset")
            self._free_proposer_state(self.scheduler.running)

    def _free_proposer_state(self, reqs: list[Request]) -> None:
        """Makes the proposer forget reqs: it resyncs them from their tokens when next asked."""
        if self.proposer is None:
            return
        for req in reqs:
            try:
                self.proposer.free(req.req_id)
            except Exception:  # noqa: BLE001 - nothing more can be done for it
                logger.exception("the proposer failed to free %s", req.req_id)

    def _accept_drafts(self, out: SchedulerOutput, result: RunnerOutput,
                       elapsed: float) -> None:
        self.spec_metrics.verify_time_s += elapsed
        self.spec_metrics.num_verify_forwards += 1
        for req, drafts, new_ids in zip(out.requests, out.draft_token_ids, result.sampled):
            if drafts and new_ids:
                try:
                    self.proposer.accept(req, len(new_ids) - 1)
                except Exception:  # noqa: BLE001 - the drafter resyncs this request
                    logger.exception("the proposer failed accepting drafts of %s", req.req_id)
                    self._free_proposer_state([req])
        self._maybe_log_spec_metrics()

    def _record_spec_step(self, req: Request, num_drafts: int, new_ids: list[int],
                          num_kept: int) -> None:
        """Counts the tokens a verification kept: a stop (eos, max_tokens) can end the request
        inside the accepted drafts, and what follows it was never emitted."""
        num_accepted = min(len(new_ids) - 1, num_kept)
        if num_kept < len(new_ids):  # drafts past the stop were neither needed nor judged
            num_drafts = min(num_drafts, num_kept)
        for metrics in (self.spec_metrics, req.metrics.setdefault("spec_decode",
                                                                  SpecDecodeMetrics())):
            metrics.record(num_drafts, num_kept, num_accepted)

    def _maybe_log_spec_metrics(self) -> None:
        if time.time() - self._last_log_time > 10.0:
            self._last_log_time = time.time()
            m = self.spec_metrics
            logger.info("speculative decoding: acceptance rate %.3f, tokens per target forward "
                        "%.2f, system efficiency %.3f, drafted %d, accepted %d, emitted %d, "
                        "draft %.1f s, verify %.1f s", m.acceptance_rate, m.mean_accepted_length,
                        m.system_efficiency(self.spec_config.num_speculative_tokens),
                        m.num_draft_tokens, m.num_accepted_tokens, m.num_emitted_tokens,
                        m.draft_time_s, m.verify_time_s)

    def _append_checked(self, req: Request, new_ids: list[int]
                        ) -> tuple[Optional[RequestStatus], int]:
        """Checks the tokens just appended to req one by one (a speculative step appends
        several); drops those after a stop, then grows the text and checks stop strings.
        Returns the status and how many of new_ids were kept."""
        base = len(req.output_token_ids) - len(new_ids)
        status = None
        for j, token_id in enumerate(new_ids):
            status = check_token_stop(req, token_id, base + j + 1, self.max_model_len)
            if status is not None:
                del req.output_token_ids[base + j + 1:]
                new_ids = new_ids[:j + 1]
                break
        new_text = self.detokenizer.decode_new_tokens(req, new_ids)
        return check_stop_strings(req, new_text) or status, len(new_ids)

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
