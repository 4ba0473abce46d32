"""The draft model as a proposer, on its own device (the CPU with cpu_draft_worker): its own copy
of the draft weights, its own paged KV cache and block pool, its own ModelRunner. Per request it
keeps a DraftSequence: the target's tokens plus its own drafts, and how far its KV is valid.

Each propose() first catches up, in one forward, on the tokens whose KV it lacks (the prompt, the
target's last token, the bonus token it never drafted, drafts it made but never fed back), then
runs k - 1 one-token forwards; accept() rolls the valid KV back to the accepted prefix. feed()
catches up without drafting (a draft process does it during plain steps).
propose_ahead(), called while the target verifies, drafts on past the proposal as if every draft
will be accepted; the next propose() uses that only if the target's tokens turned out to be
exactly the ones it guessed, and otherwise keeps the KV only where the tokens are the target's."""
import copy
import itertools
import time
from typing import Any, Optional

import torch

from vllm import envs
from vllm.config import VllmConfig
from vllm.core.block_manager import BlockManager
from vllm.core.request import Request
from vllm.core.scheduler import SchedulerOutput
from vllm.forward_context import AttentionMetadata, set_forward_context
from vllm.logger import init_logger
from vllm.model_executor import cpu_decode
from vllm.model_executor.model_loader.loader import resolve_config
from vllm.model_executor.sampler import Sampler, SamplingBatch, argmax_rows
from vllm.spec_decode.proposer import Proposal, ProposalHandle, Proposer
from vllm.worker import cpu_threads, kv_cache
from vllm.worker.model_runner import ModelRunner, block_tables_tensor, int_tensor

logger = init_logger(__name__)


class DraftSequence:
    """Quacks like a Request for ModelRunner.prepare_inputs."""

    def __init__(self, req_id: str) -> None:
        self.req_id = req_id
        self.token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        self.num_target_tokens = 0  # target tokens when the last drafts were made

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        return self.token_ids[start:end]


def draft_config(target: VllmConfig) -> VllmConfig:
    """The draft's config: the target's, with the draft model, device and dtype."""
    spec = target.speculative_config
    config = copy.deepcopy(target)
    mc = config.model_config
    # random weights (timing large shapes) apply to the draft too; any other format is found
    # again from the draft's own path
    load_format = "dummy" if mc.load_format == "dummy" else "auto"
    mc.model, mc.tokenizer, mc.load_format, mc.hf_overrides = (spec.speculative_model, None,
                                                               load_format, None)
    mc.enforce_eager = True
    # one copy, on the driver, next to a target of any tensor_parallel_size
    config.parallel_config.tensor_parallel_size = 1
    mc.max_model_len = spec.speculative_max_model_len
    if spec.cpu_draft_worker:
        config.device_config.device = "cpu"
        mc.dtype = spec.speculative_draft_dtype
    config.cache_config.num_gpu_blocks_override = None
    config = resolve_config(config)
    # no sequence outgrows the target's limit: the draft's KV cache (max_num_seqs of these) is
    # sized by it, not by the draft model's own context (Qwen2.5-0.5B's 32768 tokens beside a
    # 1024-token target held 16384 blocks, 3.2 GB, where 512 serve)
    config.model_config.max_model_len = min(config.model_config.max_model_len,
                                            target.model_config.max_model_len)
    return config


def check_vocab_match(target_tokenizer: Any, draft_tokenizer: Any, target_vocab: int,
                      draft_vocab: int) -> None:
    if target_vocab != draft_vocab:
        raise ValueError(f"the draft model's vocab_size ({draft_vocab}) differs from the "
                         f"target's ({target_vocab}); speculative decoding needs one vocabulary")
    if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ValueError("the draft model's tokenizer maps tokens to ids differently from the "
                         "target's; speculative decoding needs the same tokenizer")


class DraftModelProposer(Proposer):

    def __init__(self, target_config: VllmConfig, target_tokenizer: Any,
                 owns_process: bool = False) -> None:
        """owns_process: the draft is alone in its process (the draft process), so it may set
        the process-wide torch thread count; beside a CPU target in one process it may not."""
        from vllm.engine.tokenizer import get_tokenizer

        self.config = draft_config(target_config)
        check_vocab_match(target_tokenizer, get_tokenizer(self.config.model_config),
                          target_config.hf_config.vocab_size, self.config.hf_config.vocab_size)
        self.runner = ModelRunner(self.config)
        self.runner.load_model()
        num_blocks = kv_cache.num_blocks_for_memory(self.config)
        self.runner.initialize_cache(num_blocks)
        # plain-greedy one-token steps in one native call each run (None: not a CPU Llama draft)
        self.greedy_step = cpu_decode.GreedyStep.build(self.runner.model, self.runner.kv_caches)
        self._step_ms_kept: dict[int, torch.Tensor] = {}  # _step_ms's
        # _block_table's: (the sequences, their block counts, their table)
        self._table_kept: Optional[tuple[list, list[int], torch.Tensor]] = None
        self.num_threads = torch.get_num_threads()
        if self.config.device.type == "cpu" and (owns_process
                                                 or target_config.device.type != "cpu"):
            self.num_threads = self._set_num_threads()
        self.block_manager = BlockManager(num_blocks, self.config.cache_config.block_size)
        self.max_model_len = self.config.model_config.max_model_len
        self.seqs: dict[str, DraftSequence] = {}
        self.generators: dict[str, Optional[torch.Generator]] = {}
        # drafting ahead: what the last propose() drafted, and per request the drafts made past
        # it (with the sequence length they are valid at)
        self.last_drafted: list[tuple[Request, int]] = []
        self.ahead: dict[str, tuple[int, list[int]]] = {}
        self.ahead_stats = {"made": 0, "used": 0}
        logger.info("draft model %s on %s (%s), KV cache %d blocks",
                    self.config.model_config.model, self.config.device, self.config.torch_dtype,
                    num_blocks)

    def _set_num_threads(self) -> int:
        """--speculative-draft-threads, else VLLM_CPU_NUM_THREADS, else the count whose
        one-token forward measures fastest now."""
        n = (self.config.speculative_config.speculative_draft_threads
             or envs.VLLM_CPU_NUM_THREADS)
        if n > 0:
            torch.set_num_threads(n)
            return n
        n, times = cpu_threads.pick_num_threads(self._probe_forward,
                                                cpu_threads.candidate_counts())
        logger.info("draft threads: %d (ms per one-token forward by threads: %s)", n,
                    ", ".join(f"{k}: {v:.2f}" for k, v in times.items()))
        return n

    @torch.inference_mode()
    def _probe_forward(self) -> None:
        """One one-token forward and its greedy token, at position block_size - 1 of block 0
        (free at start-up)."""
        bs = self.config.cache_config.block_size
        md = AttentionMetadata(
            slot_mapping=torch.tensor([bs - 1]), block_tables=torch.zeros(1, 1, dtype=torch.int32),
            context_lens=torch.tensor([bs], dtype=torch.int32),
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32), max_context_len=bs,
            query_lens=[1], prefill_only=False)
        with set_forward_context(md, self.runner.kv_caches):
            hidden = self.runner.model(torch.zeros(1, dtype=torch.long), torch.tensor([bs - 1]))
        self._sample(hidden, [])  # as a greedy draft step ends

    def propose(self, requests: list[Request], max_num_drafts: list[int]) -> ProposalHandle:
        return ProposalHandle(lambda: self._propose(requests, max_num_drafts))

    @torch.inference_mode()
    def _propose(self, requests: list[Request], max_num_drafts: list[int]) -> Proposal:
        start = time.perf_counter()
        active, ks, ready, guessed = [], [], {}, set()
        for req, k in zip(requests, max_num_drafts):
            k = min(k, self.max_model_len - req.num_tokens)
            if k <= 0:
                continue
            hit = self._take_ahead(req, k)
            if hit is not None:
                guessed.add(req.req_id)
            if hit is not None and len(hit) == k:
                ready[req.req_id] = hit
            elif self._prepare(req, k):
                active.append(req)
                ks.append(k)
        drafts, probs, first_forward_s = self._draft(active, ks)
        for req_id, tokens in ready.items():
            drafts[req_id] = tokens
        self.last_drafted = [(r, len(drafts[r.req_id])) for r in requests if r.req_id in drafts]
        result = Proposal()
        for req in requests:
            d = drafts.get(req.req_id, [])
            result.draft_token_ids.append(d)
            p = probs.get(req.req_id)  # (none for greedy drafts)
            result.draft_probs.append(torch.stack(p) if d and p and p[0] is not None else None)
        result.seconds = time.perf_counter() - start
        result.first_forward_seconds = first_forward_s
        result.from_ahead = [i for i, r in enumerate(requests) if r.req_id in ready]
        result.ahead_guessed = [i for i, r in enumerate(requests) if r.req_id in guessed]
        return result

    def _draft(self, reqs: list[Request], ks: list[int]
               ) -> tuple[dict[str, list[int]], dict[str, list], float]:
        """ks[i] tokens after each sequence's tokens: the first forward feeds every token whose
        KV is missing, each later one the token drawn before it. Plain-greedy requests' steps
        run in native calls (GreedyStep), each up to the first live request's last step; the
        first forward's time (it may catch a sequence up on several tokens) is the first
        call's less its later steps' own (greedy_steps' step_ms). Before, the first forward
        was a call of its own: at batch 1 on a 16-core host, ~0.05 ms of a small draft's
        ~0.23 ms forwards were the Python and the team's start around its calls."""
        drafts = {r.req_id: [] for r in reqs}
        probs: dict[str, list] = {}  # the model path's draws' distributions, or Nones
        first_forward_s = 0.0
        greedy = (self.greedy_step is not None and envs.VLLM_CPU_GREEDY_STEP == "1"
                  and all(r.sampling_params.is_plain_greedy for r in reqs))
        step, last = 0, max(ks, default=0)
        while step < last:
            start = time.perf_counter()
            live = [(r, self.seqs[r.req_id]) for r, k in zip(reqs, ks) if k > step]
            steps = min(k for k in ks if k > step) - step
            step_ms = self._step_ms(steps) if greedy and step == 0 else None
            drawn = (self._greedy_steps([seq for _, seq in live], steps, step_ms)
                     if greedy else None)
            if drawn is not None:
                steps = len(drawn)
                for (req, seq), tokens in zip(live, zip(*drawn)):
                    seq.num_computed_tokens = len(seq.token_ids) - 1 + steps
                    seq.token_ids.extend(tokens)
                    drafts[req.req_id].extend(tokens)
            else:
                steps = 1
                self._model_step(live, drafts, probs)
            if step == 0:
                first_forward_s = time.perf_counter() - start
                if steps > 1:  # the later steps of the first call are not the first forward's
                    first_forward_s -= sum(step_ms.tolist()[1:steps]) / 1e3
            step += steps
        return drafts, probs, first_forward_s

    def _step_ms(self, steps: int) -> torch.Tensor:
        """A zeroed float64 [steps] for greedy_steps' step times, kept per size; _draft reads
        it back as a list, not sliced and summed as a tensor. On the 2-core AVX-512 Xeon VM
        (benchmarks/lab/draft_call_python.py, draft-20m, 4 forwards a call) _draft's own Python
        took 81 -> 56 us a call at batch 1 and 154 -> 120 at batch 8, _greedy_steps' 45 -> 50
        and 84 -> 98 (the cold caches after the forwards are paid elsewhere): ~20 us a call
        less in all, ~1% of a batch-1 call."""
        kept = self._step_ms_kept.get(steps)
        if kept is None:
            kept = self._step_ms_kept[steps] = torch.zeros(steps, dtype=torch.float64)
        return kept.zero_()

    def _model_step(self, live: list[tuple[Request, DraftSequence]], drafts: dict,
                    probs: dict) -> None:
        """One forward through the model and the sampler: each live sequence's tokens whose KV
        is missing, and one draft token a sequence."""
        out = SchedulerOutput(requests=[s for _, s in live],
                              num_scheduled_tokens=[s.num_tokens - s.num_computed_tokens
                                                    for _, s in live])
        out.draft_token_ids = [[] for _ in live]
        inp = self.runner.prepare_inputs(out)
        hidden = self.runner.run_model(inp)
        tokens, token_probs = self._sample(hidden[inp.logits_indices], [r for r, _ in live])
        for (req, seq), n, tok, p in zip(live, out.num_scheduled_tokens, tokens, token_probs):
            seq.num_computed_tokens += n
            seq.token_ids.append(tok)
            drafts[req.req_id].append(tok)
            probs.setdefault(req.req_id, []).append(p)

    def _greedy_steps(self, seqs: list[DraftSequence], steps: int,
                      step_ms: Optional[torch.Tensor] = None) -> Optional[list[list[int]]]:
        """The greedy tokens [steps'][sequence] of up to `steps` forwards in one native call
        (GreedyStep; the first feeds every token of a sequence whose KV is missing, each later
        one the token drawn before it): as many as every sequence's blocks cover; None where it
        does not apply: blocks that do not cover one step, or the path's own limits (its rows).
        step_ms (float64 [steps]): each step's ms, written by the call."""
        block_size = self.config.cache_config.block_size
        steps = min(steps, min(len(s.block_ids) * block_size - len(s.token_ids) + 1
                               for s in seqs))
        if steps < 1:
            return None
        fed = [len(s.token_ids) - s.num_computed_tokens for s in seqs]
        total = sum(fed)
        if min(fed) < 1 or total > cpu_decode.MAX_ROWS:  # (a prefill: the model path)
            return None
        starts = None
        if total == len(seqs):  # one token a sequence: its last, whose KV is missing
            ids = [s.token_ids[-1] for s in seqs]
            positions = [s.num_computed_tokens for s in seqs]
        else:
            ids = [t for s in seqs for t in s.token_ids[s.num_computed_tokens:]]
            positions = [p for s in seqs for p in range(s.num_computed_tokens,
                                                        len(s.token_ids))]
            starts = int_tensor([0] + list(itertools.accumulate(fed)), torch.int32)
        tokens = self.greedy_step(int_tensor(ids), int_tensor(positions),
                                  self._block_table(seqs), steps, starts,
                                  step_ms if step_ms is None or len(step_ms) == steps
                                  else step_ms[:steps])
        return None if tokens is None else tokens.tolist()

    def _block_table(self, seqs: list[DraftSequence]) -> torch.Tensor:
        """block_tables_tensor(seqs), kept while the same sequences (the same objects, held
        here) have as many blocks each: a sequence's blocks only grow (BlockManager.grow), and
        a freed one leaves self.seqs for good. Successive proposals for one batch then skip
        the table's numpy rows, one a sequence (~1 us each, warm)."""
        lengths = [len(s.block_ids) for s in seqs]
        kept = self._table_kept
        if (kept is None or len(kept[0]) != len(seqs) or kept[1] != lengths
                or any(a is not b for a, b in zip(kept[0], seqs))):
            kept = self._table_kept = (list(seqs), lengths, block_tables_tensor(seqs))
        return kept[2]

    @torch.inference_mode()
    def feed(self, requests: list[Request]) -> None:
        """Catches up, in one forward, on the KV of every token of requests but its last one
        (which the next propose() feeds as its first input), without drafting: a draft process
        does this during plain steps, so that the next proposal (a probe of the goodput
        controller) costs its k one-token forwards, not a catch-up on all the tokens since."""
        live = []
        for req in requests:
            if req.num_tokens > self.max_model_len:
                continue
            self.ahead.pop(req.req_id, None)
            if self._prepare(req, 0):
                seq = self.seqs[req.req_id]
                if seq.num_computed_tokens < req.num_tokens - 1:
                    live.append(seq)
        if not live:
            return
        out = SchedulerOutput(requests=live, num_scheduled_tokens=[
            s.num_tokens - 1 - s.num_computed_tokens for s in live])
        out.draft_token_ids = [[] for _ in live]
        self.runner.run_model(self.runner.prepare_inputs(out))
        for seq, n in zip(live, out.num_scheduled_tokens):
            seq.num_computed_tokens += n

    @torch.inference_mode()
    def propose_ahead(self) -> None:
        """While the target verifies d1..dk: feed dk, guess the target's bonus token g as the
        draft's own next token, and draft k more after it. They are used at the next propose()
        when the target accepted all k and its bonus token was g (see _take_ahead). Greedy
        requests only: a sampled request's bonus token is a draw, rarely the guess."""
        reqs, ks = [], []
        for req, k in self.last_drafted:
            seq = self.seqs.get(req.req_id)
            end = seq.num_tokens + k + 1 if seq is not None else 0
            if (k > 0 and req.sampling_params.is_plain_greedy and end <= self.max_model_len
                    and self.block_manager.grow(seq.block_ids, end)):
                reqs.append(req)
                ks.append(k + 1)
        self.last_drafted = []
        drafts, _, _ = self._draft(reqs, ks)
        for req in reqs:
            seq = self.seqs[req.req_id]
            # valid if the target's sequence becomes exactly ours up to and including g
            expected_len = seq.num_tokens - len(drafts[req.req_id]) + 1
            self.ahead[req.req_id] = (expected_len, drafts[req.req_id][1:])
            self.ahead_stats["made"] += 1

    def _take_ahead(self, req: Request, k: int) -> Optional[list[int]]:
        """The drafts made ahead for req, if its tokens are now those they were made after (the
        guess was right), at most k; the sequence then holds them where there are k of them.
        Fewer than k (the step before drafted fewer) are not used: the step drafts k afresh
        from the target's tokens, whose KV the drafting ahead made (used, the k asked for
        would be cut to the step before's, and a controller that raised k would see none of
        it: on the H200 a chain of 2-draft steps under k = 8 went on for hundreds of steps)."""
        entry = self.ahead.pop(req.req_id, None)
        seq = self.seqs.get(req.req_id)
        if entry is None or seq is None:
            return None
        expected_len, drafts = entry
        tokens = req.all_token_ids
        if len(tokens) != expected_len or seq.token_ids[:expected_len] != tokens:
            # the KV of a position is valid while every token up to it is the target's
            same = next((i for i, (a, b) in enumerate(zip(seq.token_ids, tokens)) if a != b),
                        min(len(seq.token_ids), len(tokens)))
            seq.num_computed_tokens = min(seq.num_computed_tokens, same)
            return None  # _prepare resyncs the tokens
        if len(drafts) < k:
            return drafts
        seq.token_ids = tokens + drafts[:k]
        seq.num_target_tokens = len(tokens)
        # KV valid for the target's tokens and the drafts but the last (never fed)
        seq.num_computed_tokens = min(seq.num_computed_tokens, len(tokens) + k - 1)
        self.ahead_stats["used"] += 1
        return drafts[:k]

    def _prepare(self, req: Request, k: int) -> bool:
        """Syncs the draft sequence with the target's tokens; reserves KV for k drafts."""
        seq = self.seqs.get(req.req_id)
        if seq is None:
            seq = self.seqs[req.req_id] = DraftSequence(req.req_id)
            if req.sampling_params.seed is not None:
                self.generators[req.req_id] = torch.Generator(self.config.device).manual_seed(
                    req.sampling_params.seed + 1)
        seq.token_ids = req.all_token_ids
        seq.num_target_tokens = req.num_tokens
        seq.num_computed_tokens = min(seq.num_computed_tokens, req.num_tokens - 1)
        return self.block_manager.grow(seq.block_ids, req.num_tokens + k)

    def _sample(self, hidden: torch.Tensor, reqs: list[Request]
                ) -> tuple[list[int], list[Optional[torch.Tensor]]]:
        """Greedy drafts for greedy requests (plain greedy: the argmax without fp32 logits where
        the model has compute_argmax); otherwise a draw from the draft's processed distribution
        p (returned, on the CPU, for the rejection sampler). hidden: the rows to draft from."""
        model = self.runner.model
        if all(r.sampling_params.is_plain_greedy for r in reqs):
            if hasattr(model, "compute_argmax"):
                return model.compute_argmax(hidden).tolist(), [None] * len(reqs)
            return argmax_rows(model.compute_logits(hidden)).tolist(), [None] * len(reqs)
        logits = model.compute_logits(hidden)
        batch = SamplingBatch.build(
            [r.sampling_params for r in reqs], [r.prompt_token_ids for r in reqs],
            [self.seqs[r.req_id].token_ids[r.num_prompt_tokens:] for r in reqs],
            [self.generators.get(r.req_id) for r in reqs], self.runner.vocab_size,
            self.config.device)
        penalised = Sampler.apply_penalties(logits, batch)  # once, for the draws and the argmax
        if all(r.sampling_params.is_greedy for r in reqs):
            return argmax_rows(penalised).tolist(), [None] * len(reqs)
        probs = Sampler.probs_from_penalised(penalised, batch)
        tokens = Sampler.sample_from_probs(probs, batch).tolist()
        greedy = argmax_rows(penalised).tolist()
        out_tokens, out_probs = [], []
        for i, r in enumerate(reqs):
            if r.sampling_params.is_greedy:
                out_tokens.append(greedy[i])
                out_probs.append(None)
            else:
                out_tokens.append(tokens[i])
                out_probs.append(probs[i].float().cpu())
        return out_tokens, out_probs

    def accept(self, req: Request, num_accepted: int) -> None:
        seq = self.seqs.get(req.req_id)
        ahead = self.ahead.get(req.req_id)
        if ahead is not None and num_accepted == len(ahead[1]):
            return  # all accepted: the KV made ahead stays until _take_ahead checks the bonus
        self.ahead.pop(req.req_id, None)
        if seq is not None:
            # KV is valid for the target's old tokens and the accepted drafts that were fed back
            seq.num_computed_tokens = min(seq.num_computed_tokens,
                                          seq.num_target_tokens + num_accepted)

    def free(self, req_id: str) -> None:
        self.ahead.pop(req_id, None)
        self._table_kept = None  # (holds the sequences)
        seq = self.seqs.pop(req_id, None)
        self.generators.pop(req_id, None)
        if seq is not None and seq.block_ids:
            self.block_manager.free(seq.block_ids)
