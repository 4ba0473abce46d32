"""The CPU draft in its own process: DraftProcessProposer (in the engine) speaks to a drafter
process that holds the DraftModelProposer, its KV cache and its own torch thread pool, pinned to
its own cores. torch's CPU thread count is process-wide and Python holds one GIL per process: in
its own process the draft neither shares threads with the engine's launch thread nor stalls it.

One message per engine step goes down the pipe, one comes back:

    engine -> drafter   DraftStep: frees, accepts, token-id deltas of the mirrored requests,
                        which requests to draft for (and how many tokens), draft ahead or not,
                        which to catch up on without drafting (a plain step: the engine reads
                        that answer later, never waiting for it)
    drafter -> engine   ("drafts", ids per request, draft probs per request or None, seconds
                        the drafter spent drafting them, of which its first forward's, the
                        indices of the requests whose drafts it had made ahead, of those
                        whose tokens it had guessed ahead, its drafting-ahead totals so far
                        {"made": n, "used": n}, seconds the step waited for its drafting
                        ahead)
                        then, with drafting ahead, the drafter drafts past its proposal while the
                        engine verifies it; the next DraftStep is read once that is done

The drafter mirrors each request (its token ids, sampling params) from the deltas it is sent.
Faults never change outputs, only whether a step speculates: a drafter that raises answers
("failed", message) and resets (it resyncs from full token ids); one that dies or does not answer
within the timeout is killed and a new one started in the background; until it is ready the
engine decodes without speculation. Too many failures in a row switch speculation off."""
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vllm import envs
from vllm.config import VllmConfig
from vllm.core.request import Request
from vllm.logger import init_logger
from vllm.process_utils import (child_connection, cpu_set, die_with_parent, parse_cpu_list,
                                 start_process, stop_process)
from vllm.sampling_params import SamplingParams
from vllm.spec_decode.proposer import Proposal, ProposalHandle, Proposer

logger = init_logger(__name__)

MAX_CONSECUTIVE_FAILURES = 5
START_TIMEOUT_S = 600.0
# A spinning drafter polls its pipe for VLLM_DRAFTER_SPIN_IDLE_S after its last answer, then
# sleeps on it; its torch (OpenMP) threads spin for the next parallel region about as long
# (GOMP_SPINCOUNT rounds; a round took ~11 ns on a Xeon: 20M rounds kept a thread busy 0.22 s).
# The window spans the verification between two proposals (5-20 ms on the H200), not the plain
# steps the goodput controller takes when drafting does not pay: with a 1 s window a
# never-accepted draft's probes kept its cores busy through them (run 22: the plain steps of a
# speculative engine 0.25 ms slower in their execution than plain decoding's).
SPIN_ROUND_S = 11e-9


def gomp_spin_count(spin_idle_s: float) -> int:
    return int(spin_idle_s / SPIN_ROUND_S)


@dataclass
class TokenSync:
    """A request new to the drafter's mirror (or resynced): all its token ids, its params and
    its prompt length. Later tokens come as deltas: (req_id, start, token ids from start on),
    plain tuples (a step over 64 requests pickles in a fifth of the time of dataclasses)."""
    req_id: str
    token_ids: list[int]
    params: Optional[SamplingParams]
    num_prompt_tokens: int


@dataclass
class DraftStep:
    frees: list[str] = field(default_factory=list)
    accepts: list[tuple[str, int]] = field(default_factory=list)  # (req_id, num_accepted)
    syncs: list[TokenSync] = field(default_factory=list)
    deltas: list[tuple[str, int, list[int]]] = field(default_factory=list)
    proposals: list[tuple[str, int]] = field(default_factory=list)  # (req_id, max drafts)
    draft_ahead: bool = False
    feeds: list[str] = field(default_factory=list)  # catch up on these, draft nothing
    # time.monotonic() at sending (one clock for every process of the machine): the drafter
    # tells how long the step waited for its drafting ahead
    sent_at: float = 0.0


class MirroredRequest:
    """What DraftModelProposer reads of a Request, kept in step with the engine's."""

    def __init__(self, sync: TokenSync) -> None:
        self.req_id = sync.req_id
        self.sampling_params = sync.params
        self.prompt_token_ids = sync.token_ids[:sync.num_prompt_tokens]
        self.output_token_ids = sync.token_ids[sync.num_prompt_tokens:]

    def apply(self, start: int, token_ids: list[int]) -> None:
        del self.output_token_ids[start - len(self.prompt_token_ids):]
        self.output_token_ids.extend(token_ids)

    num_prompt_tokens = Request.num_prompt_tokens
    num_tokens = Request.num_tokens
    all_token_ids = Request.all_token_ids


def _drafter_main() -> None:
    """The drafter process: load, say ready, then serve DraftSteps until the pipe closes."""
    die_with_parent()
    conn, (target_config, cpus, spin) = child_connection()
    if cpus:
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))
    try:
        from vllm.engine.tokenizer import get_tokenizer
        from vllm.spec_decode.draft_worker import DraftModelProposer
        proposer = DraftModelProposer(target_config, get_tokenizer(target_config.model_config),
                                      owns_process=True)
    except Exception as e:  # noqa: BLE001 - the engine reports it as a start-up error
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", os.getpid()))
    mirrors: dict[str, MirroredRequest] = {}
    ahead_done = 0.0  # time.monotonic() when the last drafting ahead ended
    while True:
        try:
            if spin:  # awake for the next step while steps come
                wake_until = time.monotonic() + envs.VLLM_DRAFTER_SPIN_IDLE_S
                while not conn.poll(0) and time.monotonic() < wake_until:
                    pass
            step = conn.recv()
        except (EOFError, OSError):
            return
        if step is None:
            return
        try:
            queued = max(0.0, ahead_done - step.sent_at) if step.sent_at else 0.0
            conn.send(("drafts", *_serve_step(proposer, mirrors, step), queued))
        except Exception as e:  # noqa: BLE001 - one failed step; resync everything
            logger.exception("drafter step failed; resetting its state")
            for req_id in list(mirrors):
                proposer.free(req_id)
            mirrors.clear()
            conn.send(("failed", f"{type(e).__name__}: {e}"))
            continue
        ahead_done = 0.0
        if step.draft_ahead:
            proposer.propose_ahead()
            ahead_done = time.monotonic()


def _serve_step(proposer: Any, mirrors: dict[str, MirroredRequest],
                step: DraftStep) -> tuple[list[list[int]], list, Optional[float],
                                          Optional[float], list[int], list[int],
                                          dict[str, int]]:
    for req_id in step.frees:
        proposer.free(req_id)
        mirrors.pop(req_id, None)
    for req_id, num_accepted in step.accepts:
        if req_id in mirrors:
            proposer.accept(mirrors[req_id], num_accepted)
    for sync in step.syncs:
        mirrors[sync.req_id] = MirroredRequest(sync)
    for req_id, start, token_ids in step.deltas:
        mirrors[req_id].apply(start, token_ids)
    if step.feeds:
        proposer.feed([mirrors[req_id] for req_id in step.feeds])
    reqs = [mirrors[req_id] for req_id, _ in step.proposals]
    proposal = proposer.propose(reqs, [k for _, k in step.proposals]).result()
    probs = [p.numpy() if p is not None else None for p in proposal.draft_probs]
    return (proposal.draft_token_ids, probs, proposal.seconds, proposal.first_forward_seconds,
            proposal.from_ahead, proposal.ahead_guessed, dict(proposer.ahead_stats))


class DraftProcessProposer(Proposer):
    """The engine's side: a Proposer whose drafts come from the drafter process."""
    runs_in_own_process = True

    def __init__(self, target_config: VllmConfig) -> None:
        from vllm.spec_decode.draft_worker import draft_config

        spec = target_config.speculative_config
        self.target_config = target_config
        self.config = draft_config(target_config)  # the engine reads the draft's device
        self.timeout_s = spec.speculative_draft_timeout
        self.cpus = drafter_cpus(target_config)
        self.spins = drafter_spins(self.cpus)
        self.num_tokens_sent: dict[str, int] = {}  # req_id -> tokens the mirror holds
        self.pending = DraftStep()
        self.feeding: Optional[ProposalHandle] = None  # a catch-up step not answered yet
        self.num_restarts = 0
        self.num_failures = 0
        self.consecutive_failures = 0
        self.pid: Optional[int] = None
        self.ready = False
        # drafts made ahead and used, as DraftModelProposer.ahead_stats (a caller may reset
        # them), from the drafter's totals at its last answer (which restart with it)
        self.ahead_stats = {"made": 0, "used": 0}
        self.drafter_ahead_totals = dict(self.ahead_stats)
        self._start()
        self._wait_ready()
        # the engine keeps off the drafter's cores (an offline engine is otherwise unpinned, its
        # torch threads on every core, the drafter's included); an engine core process is
        # pinned further afterwards
        kept = keep_off_cores(self.cpus)
        if kept is not None:
            logger.info("engine on cores %s (%d torch threads), off the draft process's", kept,
                        torch.get_num_threads())

    # the process

    def _start(self) -> None:
        # libgomp reads its spin count when torch loads, so it is set at the process's start
        env = ({"GOMP_SPINCOUNT": str(gomp_spin_count(envs.VLLM_DRAFTER_SPIN_IDLE_S))}
               if self.spins else None)
        self.proc, self.conn = start_process("vllm.spec_decode.draft_process", "Drafter",
                                             (self.target_config, self.cpus, self.spins), env)
        # a proposer dropped without shutdown() still takes its process with it
        weakref.finalize(self, stop_process, self.proc)
        self.ready = False
        self.pending = DraftStep()
        self.feeding = None
        self.num_tokens_sent.clear()
        self.drafter_ahead_totals = {key: 0 for key in self.drafter_ahead_totals}

    def _wait_ready(self) -> None:
        """The first start: an error (bad draft, vocabulary mismatch) is the user's."""
        if not self.conn.poll(START_TIMEOUT_S):
            self.shutdown()
            raise RuntimeError(f"the draft process did not start within {START_TIMEOUT_S} s")
        try:
            kind, value = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"the draft process exited with {self.proc.poll()} while "
                               "starting") from None
        if kind == "error":
            self.shutdown()
            raise ValueError(f"the draft model failed to start: {value}")
        self._on_ready(value)

    def _on_ready(self, pid: int) -> None:
        self.ready, self.pid = True, pid
        logger.info("draft process %d ready (cpus %s%s)", pid, self.cpus or "all",
                    ", busy-waiting between steps" if self.spins else "")

    def _poll_restart(self) -> bool:
        """Whether a restarted drafter is ready now (never waits)."""
        try:
            if not self.conn.poll():
                if self.proc.poll() is not None:
                    self._fail("the draft process exited while starting")
                return False
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            self._fail("the draft process exited while starting")
            return False
        if kind == "error":
            self._fail(f"the draft process failed to start: {value}")
            return False
        self._on_ready(value)
        return True

    def wait_until_ready(self, timeout: float) -> bool:
        """Blocks until a (re)started drafter is ready, at most timeout seconds."""
        deadline = time.monotonic() + timeout
        while not (self.ready or self._poll_restart()):
            if self.gave_up or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _fail(self, reason: str) -> None:
        """Kills the drafter and starts another, unless it keeps failing."""
        self.num_failures += 1
        self.consecutive_failures += 1
        self._kill()
        if self.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
            logger.error("%s; %d failures in a row: speculation stays off", reason,
                         self.consecutive_failures)
            return
        logger.warning("%s; decoding without speculation until a new drafter is ready",
                       reason)
        self.num_restarts += 1
        self._start()

    def _kill(self) -> None:
        self.ready = False
        self.proc.kill()
        self.proc.wait(5)
        self.conn.close()

    @property
    def gave_up(self) -> bool:
        return self.consecutive_failures >= MAX_CONSECUTIVE_FAILURES

    def shutdown(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        stop_process(self.proc)

    # the Proposer interface

    def propose(self, requests: list[Request], max_num_drafts: list[int]) -> ProposalHandle:
        empty = Proposal([[] for _ in requests], [None] * len(requests))
        if self.gave_up or not (self.ready or self._poll_restart()):
            return ProposalHandle(lambda: empty)
        if not self._finish_feeding(wait=True):
            return ProposalHandle(lambda: empty)
        step, self.pending = self.pending, DraftStep()
        step.draft_ahead = self.draft_ahead
        for req, k in zip(requests, max_num_drafts):
            self._sync(req, step)
            step.proposals.append((req.req_id, k))
        if not self._send(step):
            return ProposalHandle(lambda: empty)
        return ProposalHandle(lambda: self._receive(empty))

    def observe(self, requests: list[Request]) -> bool:
        """Sends requests' new tokens for the drafter to catch up on during the plain step;
        skipped (False) while it is still busy with the last catch-up or not ready."""
        if self.gave_up or not requests or not (self.ready or self._poll_restart()):
            return False
        if not self._finish_feeding(wait=False):
            return False  # still catching up: these tokens go with a later step
        step, self.pending = self.pending, DraftStep()
        for req in requests:
            self._sync(req, step)
            step.feeds.append(req.req_id)
        if not self._send(step):
            return False
        empty = Proposal()
        self.feeding = ProposalHandle(lambda: self._receive(empty))
        return True

    def _finish_feeding(self, wait: bool) -> bool:
        """Reads the answer to the last catch-up, if one is due (answers come in order), waiting
        for it or (wait=False) only if it is there. True when the drafter is free and ready."""
        if self.feeding is None:
            return True
        try:
            if not (wait or self.conn.poll()):
                return False
        except OSError:
            self._fail("the draft process is gone")
            return False
        self.feeding, feeding = None, self.feeding
        feeding.result()
        return self.ready

    def _send(self, step: DraftStep) -> bool:
        step.sent_at = time.monotonic()
        try:
            self.conn.send(step)
        except OSError:
            self._fail("the draft process is gone")
            return False
        return True

    def _sync(self, req: Request, step: DraftStep) -> None:
        """Adds to step what brings the drafter's mirror of req to its tokens."""
        sent = self.num_tokens_sent.get(req.req_id)
        self.num_tokens_sent[req.req_id] = req.num_tokens
        if sent is None or sent > req.num_tokens or sent < req.num_prompt_tokens:
            step.syncs.append(TokenSync(req.req_id, req.all_token_ids, req.sampling_params,
                                        req.num_prompt_tokens))
        else:
            step.deltas.append((req.req_id, sent,
                                req.output_token_ids[sent - req.num_prompt_tokens:]))

    def _answer_arrived(self) -> bool:
        """Whether the drafter's answer came: sleeps on the pipe for at most timeout_s, after
        first polling it for as long as the drafter spins (VLLM_DRAFTER_SPIN_IDLE_S) where it
        spins (it has cores of its own, the engine others): waking from that sleep cost the
        engine ~0.1 ms a step on 2 cores, ~0.02 on an H100's host (benchmarks/lab/
        drafter_wait_ab.py)."""
        if self.spins:
            until = time.monotonic() + envs.VLLM_DRAFTER_SPIN_IDLE_S
            while time.monotonic() < until:
                if self.conn.poll(0):
                    return True
        return self.conn.poll(self.timeout_s)

    def _receive(self, empty: Proposal) -> Proposal:
        try:
            if not self._answer_arrived():
                self._fail(f"the draft process did not answer within {self.timeout_s} s")
                return empty
            kind, *value = self.conn.recv()
        except (EOFError, OSError):
            self._fail("the draft process died")
            return empty
        if kind == "failed":
            self.num_failures += 1
            self.consecutive_failures += 1
            self.num_tokens_sent.clear()
            logger.warning("the drafter failed a step (%s); this step runs without "
                           "speculation", value[0])
            return empty
        self.consecutive_failures = 0
        (draft_ids, probs, seconds, first_forward_s, from_ahead, guessed, ahead_totals,
         queued) = value
        for key, total in ahead_totals.items():
            self.ahead_stats[key] += total - self.drafter_ahead_totals.get(key, 0)
        self.drafter_ahead_totals = ahead_totals
        return Proposal(draft_ids, [torch.from_numpy(p) if p is not None else None
                                    for p in probs], seconds, first_forward_s, from_ahead,
                        guessed, queued)

    def accept(self, req: Request, num_accepted: int) -> None:
        self.pending.accepts.append((req.req_id, num_accepted))

    def free(self, req_id: str) -> None:
        if self.num_tokens_sent.pop(req_id, None) is not None:
            self.pending.frees.append(req_id)


def uses_draft_process(config: VllmConfig) -> bool:
    """Whether the engine runs its draft model in a draft process: asked for (on), or (auto) a
    CPU draft beside a GPU target."""
    spec = config.speculative_config
    if not spec.enabled or spec.is_ngram:
        return False
    draft_on_cpu = spec.cpu_draft_worker or config.device.type == "cpu"
    if spec.speculative_draft_process == "on" and not draft_on_cpu:
        raise ValueError("speculative_draft_process=on runs a CPU draft: add "
                         "cpu_draft_worker=True")
    if spec.speculative_draft_process == "auto":
        return draft_on_cpu and config.device.type != "cpu"
    return spec.speculative_draft_process == "on"


def drafter_cpus(config: VllmConfig) -> Optional[list[int]]:
    """The cores the draft process is pinned to (None: unpinned)."""
    return (parse_cpu_list(config.speculative_config.speculative_draft_cpus)
            or default_draft_cpus(config))


def drafter_spins(cpus: Optional[list[int]]) -> bool:
    """VLLM_DRAFTER_SPIN: whether the draft process busy-waits between steps. Measured on the
    H200's host (trained 7B pair, k = 4, batch 1): waking from sleep for each proposal cost
    0.4-0.8 ms of 4-5, and busy-waiting made the CPU draft 2.00x plain against 1.86x (drafting
    ahead: 2.20x against 1.97x). auto spins when the drafter has cores of its own."""
    mode = envs.VLLM_DRAFTER_SPIN
    return mode == "on" or (mode == "auto" and cpus is not None)


def keep_off_drafter_cores(config: VllmConfig) -> Optional[list[int]]:
    """Pins this process (the API server) to the cores the draft process does not use, when
    there is a pinned draft process: a process that wakes up on a drafter core stalls the
    draft's thread pool at its next barrier. Returns the cores kept, or None."""
    if not uses_draft_process(config):
        return None
    return keep_off_cores(drafter_cpus(config))


def keep_off_cores(drafter: Optional[list[int]]) -> Optional[list[int]]:
    """Pins this process to the cores it may use other than drafter's (None: nothing to keep
    off, or nothing left), its torch threads to no more than those; returns the cores kept."""
    if not drafter:
        return None
    rest = sorted(os.sched_getaffinity(0) - set(drafter))
    if not rest:
        return None
    os.sched_setaffinity(0, rest)
    torch.set_num_threads(min(torch.get_num_threads(), len(rest)))
    return rest


def default_draft_cpus(target_config: VllmConfig) -> Optional[list[int]]:
    """With the target on a GPU and 4+ cores: the API server and the engine core keep the first
    two cores and their hyperthread siblings (a draft thread on a sibling would slow the
    engine's launches), the drafter gets the rest (all but the first two, if that leaves it
    fewer than two). Otherwise (a CPU target, or few cores) no pinning: the processes share what
    there is."""
    cpus = sorted(os.sched_getaffinity(0))
    if target_config.device.type == "cpu" or len(cpus) < 4:
        return None
    kept = set(cpus[:2]).union(*(thread_siblings(c) for c in cpus[:2]))
    rest = [c for c in cpus if c not in kept]
    return rest if len(rest) >= 2 else cpus[2:]


def thread_siblings(cpu: int) -> set[int]:
    """The logical cores sharing cpu's physical core (cpu itself included; {cpu} where the
    kernel does not say)."""
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    try:
        with open(path) as f:
            return {cpu} | cpu_set(f.read().strip())
    except (OSError, ValueError):
        return {cpu}


if __name__ == "__main__":
    _drafter_main()
