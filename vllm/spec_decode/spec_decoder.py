"""SpecDecoder: everything speculative decoding adds to an engine step, in one place: the
proposer (n-gram lookup, the draft model in this process or its own), the goodput controller
(k per step, drafting ahead), the proposer's faults (a failing proposer costs speculation, never
a request) and the metrics. With no speculative model every method is a no-op and k is 0.

Per step the engine calls: plan() -> k (KV slots the scheduler reserves per decoding request;
`resting`: requests left out of a split step), propose() (drafts into those slots; in a split
step it also sends the resting requests to be drafted during the verification; in a plain step
under the controller a draft process catches up on the tokens meanwhile), ahead_hook()
(work to overlap with the verification), verified() (the target's verdict: rolls the drafter
back, informs the controller), record_emitted() per request (what a stop left of its tokens),
end_step()."""
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from vllm.config import VllmConfig
from vllm.core.request import Request
from vllm.core.scheduler import Appended, SchedulerOutput, length_left
from vllm.logger import init_logger
from vllm.spec_decode.goodput import Decision, GoodputController
from vllm.spec_decode.metrics import SpecDecodeMetrics
from vllm.spec_decode.ngram_proposer import NgramProposer
from vllm.spec_decode.proposer import Proposal, ProposalHandle, Proposer

logger = init_logger(__name__)


@dataclass
class _Inflight:
    """Drafts being made for resting requests while the target verifies the others."""
    handle: ProposalHandle
    req_ids: list[str]
    k: int


class SpecDecoder:

    def __init__(self, config: VllmConfig, tokenizer: Any) -> None:
        self.config = config
        self.spec_config = spec = config.speculative_config
        self.proposer: Optional[Proposer] = self._create_proposer(tokenizer) if (
            spec.enabled) else None
        self.draft_ahead = self._draft_ahead()  # propose() passes each step's choice on
        self.controller: Optional[GoodputController] = None
        if self.proposer is not None and spec.speculative_adaptive == "on":
            self.controller = self.make_controller(spec.num_speculative_tokens)
        # batched overlap: the drafts being made during this step for the resting requests
        self.inflight: Optional[_Inflight] = None
        self.resting: list[Request] = []
        self.metrics = SpecDecodeMetrics()
        self.decision = Decision(0)
        self._step_start = 0.0
        self._draft_s = 0.0
        # this step's waited-for proposal (its drafter's timing, its wait for drafting ahead,
        # which of its drafts had been made ahead), None before or without one
        self._waited: Optional[Proposal] = None
        self._drafted_last_step: set[str] = set()
        self._seen: dict[str, int] = {}  # req_id -> its tokens when last sent to the proposer
        self._draft_measured = False
        # req_id -> k: requests whose k drafts were all accepted in the last step, which drafted
        # ahead; their next proposal tells whether the drafter had guessed the bonus token
        self._ahead_pending: dict[str, int] = {}
        # the last step, for the controller's realized goodput once the next one starts:
        # (its controller, decoding requests, speculated, tokens emitted, its start)
        self._realized_step: Optional[tuple] = None
        self._last_log_time = time.time()

    # set-up

    def _create_proposer(self, tokenizer: Any) -> Proposer:
        spec = self.spec_config
        if spec.is_ngram:
            return NgramProposer(spec.ngram_prompt_lookup_max, spec.ngram_prompt_lookup_min)
        if self._use_draft_process():
            from vllm.spec_decode.draft_process import DraftProcessProposer
            return DraftProcessProposer(self.config)
        from vllm.spec_decode.draft_worker import DraftModelProposer
        return DraftModelProposer(self.config, tokenizer)

    def make_controller(self, max_k: int) -> GoodputController:
        """A goodput controller for this engine's proposer: it may choose drafting ahead where
        that is left to it (auto, the draft on another device) and batched overlap where the
        draft has its own process; on a CPU target, whose verification grows with its tokens,
        k climbs one at a time past the verification sizes measured (explore_upward)."""
        spec = self.spec_config
        ahead_left_to_it = self._draft_ahead() and spec.speculative_draft_ahead == "auto"
        controller = GoodputController(max_k, draft_ahead_overlaps=ahead_left_to_it,
                                       explore_upward=self.config.device.type == "cpu")
        controller.can_split = (spec.speculative_batch_split == "auto"
                                and self.proposer.runs_in_own_process)
        return controller

    def _use_draft_process(self) -> bool:
        from vllm.spec_decode.draft_process import uses_draft_process
        return uses_draft_process(self.config)

    def _draft_ahead(self) -> bool:
        """Drafting ahead pays when it overlaps the target's forward: the draft on another
        device (the CPU) than the target (the GPU), in the engine's process or its own. 'on'
        forces it (tests on the CPU). Measured on the H200 (trained 7B-shape pair, draft
        process, batch 1; its synchronous rows beside it in the same call): 2.30 / 2.40 /
        2.44x plain at k = 4 / 6 / 8 against 1.89 / 2.04 / 2.04x. With the controller on,
        'auto' lets it decide per step whether drafting ahead pays."""
        mode = self.spec_config.speculative_draft_ahead
        draft_config = getattr(self.proposer, "config", None)
        if self.proposer is None or mode == "off" or draft_config is None:
            return False
        return mode == "on" or draft_config.device.type != self.config.device.type

    def shutdown(self) -> None:
        if self.proposer is not None:
            self.proposer.shutdown()

    # one step

    def plan(self, running: list[Request]) -> int:
        """k for this step: 0 without a proposer or at --speculative-disable-by-batch-size
        running requests; else the controller's choice (the configured k with it off)."""
        self._step_start = time.perf_counter()
        if self._realized_step is not None:  # the last step ran from its start to now
            controller, num_requests, speculated, tokens, start = self._realized_step
            self._realized_step = None
            if controller is self.controller:  # (a benchmark swaps controllers between runs)
                controller.realized.record(num_requests, speculated, tokens,
                                           self._step_start - start)
        self._draft_s = 0.0
        self._waited = None
        spec = self.spec_config
        decoding = None  # worked out only where a decision needs it (never for plain engines)
        if self.proposer is None or (spec.speculative_disable_by_batch_size is not None
                                     and len(running) >= spec.speculative_disable_by_batch_size):
            self.decision = Decision(0)
        elif self.controller is None:
            self.decision = Decision(spec.num_speculative_tokens, self.draft_ahead)
        else:
            # seeded requests must come out the same on every run: timing may not change k
            seeded = any(r.sampling_params.seed is not None for r in running)
            decoding = _decoding(running)
            catch_up = sum(self._unseen(r) for r in decoding)
            self.decision = self.controller.decide(
                [r.req_id for r in decoding], seeded, catch_up,
                [r.sampling_params.is_plain_greedy for r in decoding],
                lambda: self._tokens_left(decoding))
            if self.spec_config.speculative_draft_ahead == "on" and not self.decision.probe:
                self.decision.draft_ahead = self.draft_ahead
        self.resting = self._plan_split(running, decoding)
        return self.decision.k

    def _unseen(self, req: Request) -> int:
        """The tokens of req whose KV its drafter lacks: every token since the proposer last
        had it, but at most 2 where it drafted for req in the last step (it holds the KV of
        the drafts the target accepted; the last draft and the target's bonus token are new).
        Counted as every token since, a step after 3 accepted drafts read as a catch-up of 4
        a request, and the controller priced a resume's catch-up into every speculative step
        of a well-accepted draft."""
        unseen = req.num_tokens - self._seen.get(req.req_id, 0)
        return min(unseen, 2) if req.req_id in self._drafted_last_step else unseen

    def _tokens_left(self, decoding: list[Request]) -> Optional[float]:
        """The most tokens the decoding requests may still generate, on average: each one's
        max_tokens, or the model's length, less its output so far."""
        if not decoding:
            return None
        limit = self.config.model_config.max_model_len
        return sum(max(length_left(r, len(r.output_token_ids), limit), 1)
                   for r in decoding) / len(decoding)

    def _plan_split(self, running: list[Request],
                    decoding: Optional[list[Request]]) -> list[Request]:
        """The decoding requests to draft during this step's verification (batched overlap),
        left out of the step: those not drafted during the previous one. The first split step
        verifies the first half (drafted now, synchronously)."""
        mode = self.spec_config.speculative_batch_split
        split = (self.decision.k > 0 and self.proposer is not None
                 and getattr(self.proposer, "runs_in_own_process", False)
                 and (mode == "on" or (mode == "auto" and self.decision.split)))
        if split and decoding is None:
            decoding = _decoding(running)
        if not split or len(decoding) < 2:
            self.decision.split = False
            return []
        self.decision.split = True
        self.decision.draft_ahead = False  # the drafter is busy with the other half
        drafted = set(self.inflight.req_ids) if self.inflight is not None else set()
        verified = [r for r in decoding if r.req_id in drafted] or decoding[:len(decoding) // 2]
        verified_ids = {r.req_id for r in verified}
        return [r for r in decoding if r.req_id not in verified_ids]

    def propose(self, out: SchedulerOutput) -> bool:
        """Puts drafts into the reserved lookahead slots: those made during the previous step
        (batched overlap), else the proposer's, waited for now; then, in a split step, sends
        the resting requests to be drafted during this step's verification. False if no
        drafts came."""
        if self.proposer is None:
            return False
        start = time.perf_counter()
        # this step's choice reaches a draft process with the proposal (it drafts ahead after
        # answering); an in-process proposer drafts ahead from ahead_hook
        self.proposer.draft_ahead = self.decision.draft_ahead
        ready = self._collect_inflight()
        idx = [i for i, n in enumerate(out.num_lookahead) if n > 0]
        if not idx:  # a plain step
            if self.controller is None:
                self._feed(self._prompts(out))  # the next steps draft for them
            elif self.controller.feeding_pays():
                self._observe(out)
        need = [i for i in idx if out.requests[i].req_id not in ready]
        # a proposal measures the draft forward when the drafter is caught up: it drafted for
        # the request in the last step, or saw its tokens but the last one or two
        fresh = all(self._unseen(out.requests[i]) <= 2 for i in need)
        if need:
            ready.update(self._propose_now([out.requests[i] for i in need],
                                           [out.num_lookahead[i] for i in need]))
        # what is not heard now is stale, but for the resting requests of a split step (their
        # proposal is sent now, its answer read at the next step)
        resting = {r.req_id for r in self.resting}
        self._ahead_pending = {r: k for r, k in self._ahead_pending.items() if r in resting}
        for i in idx:
            self._seen[out.requests[i].req_id] = out.requests[i].num_tokens
            drafts, probs = ready.pop(out.requests[i].req_id, ([], None))
            drafts = drafts[:out.num_lookahead[i]]
            out.draft_token_ids[i] = drafts
            out.num_scheduled_tokens[i] += len(drafts)
            if probs is not None and drafts:
                out.draft_probs[i] = probs[:len(drafts)]
        # drafts no step uses (the request stopped decoding, or k fell to 0): the drafter
        # holds them as proposed, so it forgets those requests and resyncs them later
        for req_id in ready:
            self._free_id(req_id)
        self._draft_s = time.perf_counter() - start
        self._send_resting()
        if not idx:
            return False
        self._feed(self._prompts(out))
        self.metrics.draft_time_s += self._draft_s
        self.metrics.num_propose_calls += 1
        drafted = {out.requests[i].req_id for i in idx if out.draft_token_ids[i]}
        # drafts made ahead cost no forward now: such a proposal prices no draft forward (run
        # 17 on the H200: priced at ~0 ms a forward, the controller took k = 8 at 1.41x plain
        # where k = 4 gave 1.65x)
        self._draft_measured = bool(drafted) and fresh and not (
            self._waited and self._waited.num_from_ahead)
        self._drafted_last_step = drafted
        return bool(drafted)

    def _observe(self, out: SchedulerOutput) -> None:
        """A plain step: a proposer with cores of its own catches up on the decoding requests'
        tokens meanwhile (the controller's next probe then costs drafting only), and on the
        prompts the step completes."""
        decoding = [r for r, n in zip(out.requests, out.num_scheduled_tokens) if n == 1]
        ids = {r.req_id for r in decoding}  # a one-token prompt is both
        self._feed(decoding + [r for r in self._prompts(out) if r.req_id not in ids])

    @staticmethod
    def _prompts(out: SchedulerOutput) -> list[Request]:
        """The requests whose prompt (or recomputation) this step completes: they decode from
        the next step."""
        return [r for i, r in enumerate(out.requests) if out.num_lookahead[i] == 0
                and out.samples(i) and (r.num_computed_tokens == 0
                                        or out.num_scheduled_tokens[i] > 1)]

    def _feed(self, reqs: list[Request]) -> None:
        """Sends reqs' tokens to a proposer with cores of its own to catch up on while the
        target runs this step (after the step's proposals: the engine does not wait for it).
        A prompt fed so is not prefilled in its first proposal, which the engine waits for."""
        if not reqs:
            return
        try:
            fed = self.proposer.observe(reqs)
        except Exception:  # noqa: BLE001 - speculation is an optimisation: the step goes on
            logger.exception("the proposer failed catching up; its requests are resynced")
            self.free(reqs)
            return
        if fed:
            for r in reqs:
                self._seen[r.req_id] = r.num_tokens

    def _propose_now(self, reqs: list[Request], ks: list[int]) -> dict[str, tuple]:
        """req_id -> (drafts, probs) from the proposer, waited for; {} if it failed."""
        try:
            proposal = self.proposer.propose(reqs, ks).result()
            self._check_proposal(proposal, len(reqs))
        except Exception:  # noqa: BLE001 - the step goes on without speculation
            logger.exception("the proposer failed; this step runs without speculation")
            self.free(reqs)
            return {}
        self.metrics.drafter_busy_s += proposal.seconds or 0.0
        self.metrics.drafter_first_forward_s += proposal.first_forward_seconds or 0.0
        self._waited = proposal
        self._hear_ahead([r.req_id for r in reqs], proposal)
        return {r.req_id: (d, p) for r, d, p in zip(reqs, proposal.draft_token_ids,
                                                    proposal.draft_probs)}

    def _hear_ahead(self, req_ids: list[str], proposal: Any) -> None:
        """Tells the controller, for each of req_ids whose drafts were all accepted in a step
        that drafted ahead, whether the drafter had guessed its tokens (its bonus token)."""
        if self.controller is None or not self._ahead_pending:
            return
        used = set(proposal.ahead_guessed)
        for i, req_id in enumerate(req_ids):
            k = self._ahead_pending.pop(req_id, None)
            if k is not None:
                self.controller.record_ahead(req_id, k, i in used)

    def _send_resting(self) -> None:
        """A split step: the resting requests are drafted while the target verifies."""
        if not self.resting:
            return
        reqs, k = self.resting, self.decision.k
        try:
            handle = self.proposer.propose(reqs, [k] * len(reqs))
        except Exception:  # noqa: BLE001 - they are drafted again, synchronously, next step
            logger.exception("the proposer failed; the resting requests are drafted later")
            self.free(reqs)
            return
        self.inflight = _Inflight(handle, [r.req_id for r in reqs], k)
        for r in reqs:
            self._seen[r.req_id] = r.num_tokens

    def _collect_inflight(self) -> dict[str, tuple]:
        """req_id -> (drafts, probs) made during the previous step (waits for them); the
        drafter's own timing of them goes to the controller."""
        inflight, self.inflight = self.inflight, None
        if inflight is None:
            return {}
        try:
            proposal = inflight.handle.result()
            self._check_proposal(proposal, len(inflight.req_ids))
        except Exception:  # noqa: BLE001 - they are drafted again, synchronously
            logger.exception("the proposer failed; the resting requests are drafted again")
            for req_id in inflight.req_ids:
                self._free_id(req_id)
            return {}
        self._hear_ahead(inflight.req_ids, proposal)
        if self.controller is not None and proposal.seconds and any(proposal.draft_token_ids):
            self.controller.record_draft(len(inflight.req_ids), inflight.k, proposal.seconds,
                                         proposal.first_forward_seconds)
        return {r: (d, p) for r, d, p in zip(inflight.req_ids, proposal.draft_token_ids,
                                             proposal.draft_probs)}

    def _check_proposal(self, proposal: Any, num_requests: int) -> None:
        vocab = self.config.hf_config.vocab_size
        if (len(proposal.draft_token_ids) != num_requests
                or len(proposal.draft_probs) != num_requests):
            raise ValueError(f"the proposal has {len(proposal.draft_token_ids)} entries for "
                             f"{num_requests} requests")
        for drafts in proposal.draft_token_ids:
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in drafts):
                raise ValueError(f"the proposal holds token ids outside [0, {vocab}): {drafts}")

    def ahead_hook(self, speculating: bool) -> Optional[Callable[[], None]]:
        """What the executor runs once the verification is queued: drafting ahead, if this
        step drafts and drafting ahead was chosen."""
        if speculating and self.proposer is not None and self.decision.draft_ahead:
            return self._propose_ahead
        return None

    def _propose_ahead(self) -> None:
        """The proposer drafting ahead during the verification; if it fails, the drafters of
        the requests it drafted for start over (the verification itself is unaffected)."""
        try:
            self.proposer.propose_ahead()
        except Exception:  # noqa: BLE001 - speculation is an optimisation
            logger.exception("the proposer failed drafting ahead; its state is reset")
            for req_id in list(self._drafted_last_step):
                self._free_id(req_id)

    def verified(self, out: SchedulerOutput, sampled: list, verify_s: float) -> None:
        """The target's verdict on this step's drafts: each drafter rolls back to what was
        accepted, and the controller hears every request's verdict."""
        if not any(out.draft_token_ids):
            self._drafted_last_step = set()
            return
        # the drafter drafted past these drafts while the target verified them (greedy requests
        # only): where all were accepted, the next proposal tells whether its guess was right
        ahead = self.controller is not None and self.decision.draft_ahead
        self.metrics.verify_time_s += verify_s
        self.metrics.num_verify_forwards += 1
        for req, drafts, new_ids in zip(out.requests, out.draft_token_ids, sampled):
            if not (drafts and new_ids):
                continue
            if self.controller is not None:
                self.controller.record_verdict(req.req_id, len(drafts), len(new_ids) - 1)
            if ahead and len(new_ids) - 1 == len(drafts) and req.sampling_params.is_plain_greedy:
                self._ahead_pending[req.req_id] = len(drafts)
            try:
                self.proposer.accept(req, len(new_ids) - 1)
            except Exception:  # noqa: BLE001 - the drafter resyncs this request
                logger.exception("the proposer failed accepting drafts of %s", req.req_id)
                self.free([req])
        self._maybe_log()

    def record_emitted(self, req: Request, num_drafts: int, new_ids: list[int],
                       num_kept: int) -> None:
        """Counts the tokens a verification kept: a stop (eos, max_tokens) can end the request
        inside the accepted drafts, and what follows it was never emitted."""
        num_accepted = min(len(new_ids) - 1, num_kept)
        if num_kept < len(new_ids):  # drafts past the stop were neither needed nor judged
            num_drafts = min(num_drafts, num_kept)
        for metrics in (self.metrics, req.metrics.setdefault("spec_decode",
                                                             SpecDecodeMetrics())):
            metrics.record(num_drafts, num_kept, num_accepted)

    def end_step(self, out: SchedulerOutput, appended: list[Optional[Appended]]) -> None:
        """Tells the controller the tokens the step emitted (appended: Scheduler.update's
        result; its realized goodput, whose time ends when the next step starts) and what a
        decode-only step (every request brings its last token, plus drafts) cost."""
        if self.controller is None:
            return
        speculated = any(out.draft_token_ids)
        if self.controller.arm is not None:
            num_emitted = sum(a.num_kept for a in appended if a is not None)
            self._realized_step = (self.controller, self.controller.arm[0], speculated,
                                   num_emitted, self._step_start)
        if not all(n == 1 + len(d) for n, d in zip(out.num_scheduled_tokens,
                                                   out.draft_token_ids)):
            return  # a prompt (chunk) is in the step
        k = self.decision.k if speculated else 0
        decision = self.decision if k == self.decision.k else Decision(0)
        w = self._waited or Proposal()
        # drafts made ahead for every request (none drafted now): the step measures their wait
        all_ahead = 0 < w.num_from_ahead == len(w.draft_token_ids) == len(out.requests)
        self.controller.record_step(decision, len(out.requests), out.total_num_tokens,
                                    self._draft_s, time.perf_counter() - self._step_start,
                                    self._draft_measured, w.seconds, w.first_forward_seconds,
                                    ahead_hit=all_ahead, queued_s=w.queued_seconds)

    def free(self, reqs: list[Request]) -> None:
        """Makes the proposer forget reqs (finished, or to resync from their tokens)."""
        for req in reqs:
            self._free_id(req.req_id)

    def _free_id(self, req_id: str) -> None:
        self._seen.pop(req_id, None)
        if self.controller is not None:
            self.controller.free(req_id)
        if self.proposer is None:
            return
        try:
            self.proposer.free(req_id)
        except Exception:  # noqa: BLE001 - nothing more can be done for it
            logger.exception("the proposer failed to free %s", req_id)

    # figures

    def stats(self) -> Optional[dict]:
        if not self.spec_config.enabled:
            return None
        spec = self.metrics.as_dict(self.spec_config.num_speculative_tokens)
        for key in ("num_restarts", "num_failures"):
            if hasattr(self.proposer, key):
                spec[f"drafter_{key}"] = getattr(self.proposer, key)
        if self.controller is not None:
            spec.update(self.controller.as_dict())
        return spec

    def _maybe_log(self) -> None:
        if time.time() - self._last_log_time <= 10.0:
            return
        self._last_log_time = time.time()
        m = self.metrics
        logger.info("speculative decoding: acceptance rate %.3f, tokens per target forward "
                    "%.2f, system efficiency %.3f, drafted %d, accepted %d, emitted %d, "
                    "draft %.1f s, verify %.1f s", m.acceptance_rate, m.mean_accepted_length,
                    m.system_efficiency(self.spec_config.num_speculative_tokens),
                    m.num_draft_tokens, m.num_accepted_tokens, m.num_emitted_tokens,
                    m.draft_time_s, m.verify_time_s)
        if self.controller is not None:
            logger.info("goodput controller: %s", self.controller.describe())


def _decoding(running: list[Request]) -> list[Request]:
    """The running requests past their prompt (each brings its last token to this step)."""
    return [r for r in running if r.num_computed_tokens == r.num_tokens - 1]
