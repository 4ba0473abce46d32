"""ModelRunner: turns a SchedulerOutput into one forward pass on its device and samples.

Per step it builds, on the host, the flat batch (token ids and positions of every scheduled
token), the attention metadata (cache slots, block tables, context lengths, query offsets), and
the rows whose logits are needed (the last token of each request that samples), then moves them to
the device in one go."""
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from vllm.config import VllmConfig
from vllm.core.request import Request
from vllm.core.scheduler import SchedulerOutput
from vllm.distributed.parallel_state import get_world
from vllm.forward_context import AttentionMetadata, set_forward_context
from vllm.model_executor.model_loader.loader import get_model
from vllm.model_executor.rejection_sampler import RejectionSampler, VerificationInputs
from vllm.model_executor.sampler import (LogprobsTensors, Sampler, SamplerOutput, SamplingBatch,
                                         compute_prompt_logprobs, nonfinite_logit_rows)
from vllm.worker import kv_cache
from vllm.worker.cuda_graph import CudaGraphRunner

NONFINITE_MESSAGE = ("sampling failed: the logits or probabilities of this request were not "
                     "finite (NaN or inf), e.g. from extreme sampling parameters")


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attn_metadata: AttentionMetadata
    # [num_rows]: batch rows whose logits are needed: each sampling request's last token, plus
    # its drafts' rows when it speculates
    logits_indices: torch.Tensor
    sampling_requests: list[int]  # index into SchedulerOutput.requests, aligned with the above


@dataclass
class RunnerOutput:
    sampled: list[Optional[list[int]]]  # per scheduled request: new token ids, None mid-prompt
    sampler_output: Optional[SamplerOutput]  # rows aligned with sampling_requests
    sampling_requests: list[int]
    prompt_logprobs: dict[int, LogprobsTensors]  # request index -> its prompt's logprobs
    # speculative steps: request index -> one row per emitted token (requests asking for logprobs)
    token_logprobs: dict[int, LogprobsTensors] = field(default_factory=dict)
    # request index -> why its sampling failed (non-finite logits or probabilities); such a
    # request's entry in sampled is None and the engine finishes it with that error
    failed: dict[int, str] = field(default_factory=dict)


def block_tables_tensor(seqs: list) -> torch.Tensor:
    """Each sequence's block ids, padded with block 0 to the longest: block_tables, an int32 CPU
    tensor. Through numpy: torch.tensor of the nested lists took 2.1-2.6x as long (8 rows of 37
    blocks 27.6 -> 13.2 us, 32 of 64 158 -> 61 us, on a 2-core EPYC), paid at every step."""
    width = max(len(s.block_ids) for s in seqs)
    table = np.zeros((len(seqs), width), dtype=np.int32)
    for row, s in zip(table, seqs):
        row[:len(s.block_ids)] = s.block_ids
    return torch.from_numpy(table)


def int_tensor(values: list, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A 1-D CPU tensor of a list of ints, through numpy (a few us less than torch.tensor)."""
    return torch.from_numpy(np.array(values, dtype=_NUMPY_INTS[dtype]))


_NUMPY_INTS = {torch.long: np.int64, torch.int32: np.int32}


class ModelRunner:

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.device = config.device
        self.block_size = config.cache_config.block_size
        self.model: Optional[torch.nn.Module] = None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.sampler = Sampler()
        self.vocab_size = config.hf_config.vocab_size
        self.cuda_graphs: Optional[CudaGraphRunner] = None
        # under tensor parallelism only the driver (rank 0) samples; the other ranks run the same
        # forward and logits (their collectives) and return nothing
        self.is_driver = get_world().is_driver
        spec = config.speculative_config
        self.rejection_sampler = RejectionSampler(
            spec.spec_decoding_acceptance_method,
            spec.typical_acceptance_sampler_posterior_threshold,
            spec.typical_acceptance_sampler_posterior_alpha)

    def load_model(self) -> None:
        self.model = get_model(self.config)

    def initialize_cache(self, num_blocks: int) -> None:
        self.kv_caches = kv_cache.allocate_kv_caches(self.config, num_blocks)
        if self.device.type == "cuda" and not self.config.model_config.enforce_eager:
            mc, sc = self.config.model_config, self.config.scheduler_config
            spec = self.config.speculative_config
            # a verification step feeds each sequence its last token and k drafts
            max_query_len = 1 + (spec.num_speculative_tokens or 0) if spec.enabled else 1
            self.cuda_graphs = CudaGraphRunner(
                self.model, self.kv_caches, sc.max_num_seqs, mc.max_model_len, self.block_size,
                self.device, max_query_len)
            self.cuda_graphs.capture()

    @torch.inference_mode()
    def profile_peak_memory(self) -> int:
        """Activation bytes of the largest step (a max_num_batched_tokens prefill), measured."""
        if self.device.type != "cuda":
            return 0
        num_tokens = self.config.scheduler_config.max_num_batched_tokens
        caches = kv_cache.allocate_kv_caches(self.config, 1)
        md = AttentionMetadata(
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.long, device=self.device),
            block_tables=torch.zeros(1, 1, dtype=torch.int32, device=self.device),
            context_lens=torch.tensor([num_tokens], dtype=torch.int32, device=self.device),
            query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=self.device),
            max_context_len=num_tokens, query_lens=[num_tokens], prefill_only=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        with set_forward_context(md, caches):
            hidden = self.model(ids, torch.arange(num_tokens, device=self.device))
        self.model.compute_logits(hidden[-self.config.scheduler_config.max_num_seqs:])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        del caches, hidden
        torch.cuda.empty_cache()
        return peak

    def prepare_inputs(self, out: SchedulerOutput) -> ModelInput:
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        context_lens: list[int] = []
        query_start_loc = [0]
        logits_indices: list[int] = []
        sampling_requests: list[int] = []
        bs = self.block_size
        for i, (req, num_new) in enumerate(zip(out.requests, out.num_scheduled_tokens)):
            start = req.num_computed_tokens
            end = start + num_new
            drafts = out.draft_token_ids[i] if out.draft_token_ids else []
            input_ids.extend(req.token_slice(start, end - len(drafts)))
            input_ids.extend(drafts)
            positions.extend(range(start, end))
            blocks = req.block_ids
            slot_mapping.extend(blocks[p // bs] * bs + p % bs for p in range(start, end))
            context_lens.append(end)
            query_start_loc.append(query_start_loc[-1] + num_new)
            if out.samples(i):
                # the last token's row, and with drafts each draft's row too
                last = query_start_loc[-1]
                logits_indices.extend(range(last - 1 - len(drafts), last))
                sampling_requests.append(i)
        dev = self.device

        def to_dev(values, dtype):
            return int_tensor(values, dtype).to(dev, non_blocking=True)

        md = AttentionMetadata(
            slot_mapping=to_dev(slot_mapping, torch.long),
            block_tables=block_tables_tensor(out.requests).to(dev, non_blocking=True),
            context_lens=to_dev(context_lens, torch.int32),
            query_start_loc=to_dev(query_start_loc, torch.int32),
            max_context_len=max(context_lens),
            query_lens=list(out.num_scheduled_tokens),
            prefill_only=all(r.num_computed_tokens == 0 for r in out.requests))
        return ModelInput(to_dev(input_ids, torch.long), to_dev(positions, torch.long), md,
                          to_dev(logits_indices, torch.long), sampling_requests)

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput,
                      before_sync: Optional[Callable[[], None]] = None) -> Optional[RunnerOutput]:
        """One forward and its sampling. In a verification step, before_sync (the proposer
        drafting ahead) runs once the target's device work is queued and before its results are
        read back: with the target on the GPU and the draft on the CPU, the two overlap. Returns
        None on the tensor-parallel ranks other than the driver."""
        inp = self.prepare_inputs(out)
        if not self.is_driver:
            hidden = self.run_model(inp)
            self._prompt_logprobs(out, inp, hidden)
            if inp.sampling_requests:
                self.model.compute_logits(hidden[inp.logits_indices])
            return None
        drafts = [out.draft_token_ids[i] if out.draft_token_ids else []
                  for i in inp.sampling_requests]
        # everything the verification copies to the device goes before the forward is launched,
        # so that nothing waits for the forward until the read-back
        verify = self._prepare_verify(out, inp.sampling_requests, drafts) if any(drafts) else None
        hidden = self.run_model(inp)  # [num_tokens, hidden_size]
        prompt_logprobs = self._prompt_logprobs(out, inp, hidden)
        sampled: list[Optional[list[int]]] = [None] * len(out.requests)
        sampler_output = None
        token_logprobs: dict[int, LogprobsTensors] = {}
        failed: dict[int, str] = {}
        if inp.sampling_requests:
            logits = self.model.compute_logits(hidden[inp.logits_indices])  # [num_rows, V]
            if verify is not None:
                bad_rows = nonfinite_logit_rows(logits)  # [num_rows]
                finish = self.rejection_sampler.verify_async(logits, verify)
                if before_sync is not None:
                    before_sync()
                results = finish()
                bad, row = bad_rows.tolist(), 0
                for i, draft, new_ids in zip(inp.sampling_requests, drafts, results):
                    if any(bad[row:row + len(draft) + 1]):
                        failed[i] = NONFINITE_MESSAGE
                    else:
                        sampled[i] = new_ids
                    row += len(draft) + 1
                token_logprobs = self._verified_logprobs(out, inp.sampling_requests, drafts,
                                                         logits, results)
            else:
                reqs = [out.requests[i] for i in inp.sampling_requests]
                batch = self.build_sampling_batch(reqs)
                sampler_output = self.sampler.sample(logits, batch)
                token_ids = sampler_output.sampled_token_ids.tolist()
                bad = sampler_output.nonfinite_rows.tolist()
                for i, token_id, is_bad in zip(inp.sampling_requests, token_ids, bad):
                    if is_bad:
                        failed[i] = NONFINITE_MESSAGE
                    else:
                        sampled[i] = [token_id]
        return RunnerOutput(sampled, sampler_output, inp.sampling_requests, prompt_logprobs,
                            token_logprobs, failed)

    def _prepare_verify(self, out: SchedulerOutput, indices: list[int],
                        drafts: list[list[int]]) -> VerificationInputs:
        """The rejection sampler's inputs but the logits: one sampling row per target row (row
        j of a request has seen its first j drafts; none when every request is plain greedy),
        the drafts and their distributions on the device."""
        reqs = [out.requests[i] for i in indices]
        batch = None  # plain greedy: the argmax of the raw logits decides, no sampling rows
        if not all(r.sampling_params.is_plain_greedy for r in reqs):
            rows = [(r, d[:j]) for r, d in zip(reqs, drafts) for j in range(len(d) + 1)]
            batch = SamplingBatch.build(
                [r.sampling_params for r, _ in rows], [r.prompt_token_ids for r, _ in rows],
                [r.output_token_ids + seen for r, seen in rows], [None] * len(rows),
                self.vocab_size, self.device, eos_token_id=reqs[0].eos_token_id)
        return VerificationInputs.build(
            drafts, [out.draft_probs.get(i) for i in indices],
            [r.sampling_params.is_greedy for r in reqs], [r.generator for r in reqs], batch,
            self.device)

    def _verified_logprobs(self, out: SchedulerOutput, indices: list[int],
                           drafts: list[list[int]], logits: torch.Tensor,
                           results: list[list[int]]) -> dict[int, LogprobsTensors]:
        """Logprobs of the tokens a verification emitted, from the target's rows they were
        judged on (row j of a request scored the token after its first j drafts), for the
        requests that asked; as a plain decode step would report them."""
        rows, targets, owners = [], [], []
        start = 0
        for i, draft, new_ids in zip(indices, drafts, results):
            if out.requests[i].sampling_params.logprobs is not None:
                rows += range(start, start + len(new_ids))
                targets += new_ids
                owners.append((i, len(new_ids)))
            start += len(draft) + 1
        if not owners:
            return {}
        num_top = max(out.requests[i].sampling_params.logprobs for i, _ in owners)
        lt = compute_prompt_logprobs(
            logits[torch.tensor(rows, device=logits.device)],
            torch.tensor(targets, dtype=torch.long, device=logits.device), num_top)
        result, pos = {}, 0
        for i, n in owners:
            result[i] = LogprobsTensors(lt.logprob_token_ids[pos:pos + n],
                                        lt.logprobs[pos:pos + n],
                                        lt.selected_token_ranks[pos:pos + n])
            pos += n
        return result

    def run_model(self, inp: ModelInput) -> torch.Tensor:
        md = inp.attn_metadata
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(len(md.query_lens), md):
            return self.cuda_graphs.run(inp.input_ids, inp.positions, md)
        with set_forward_context(md, self.kv_caches):
            return self.model(inp.input_ids, inp.positions)

    def build_sampling_batch(self, reqs: list[Request]) -> SamplingBatch:
        return SamplingBatch.build(
            [r.sampling_params for r in reqs], [r.prompt_token_ids for r in reqs],
            [r.output_token_ids for r in reqs], [r.generator for r in reqs], self.vocab_size,
            self.device, eos_token_id=reqs[0].eos_token_id)

    def _prompt_logprobs(self, out: SchedulerOutput, inp: ModelInput,
                         hidden: torch.Tensor) -> dict[int, LogprobsTensors]:
        result = {}
        for i, req in enumerate(out.requests):
            num_top = req.sampling_params.prompt_logprobs
            if num_top is None or req.num_computed_tokens != 0 or req.prompt_logprobs is not None:
                continue
            start = int(sum(out.num_scheduled_tokens[:i]))
            n = req.num_prompt_tokens
            logits = self.model.compute_logits(hidden[start:start + n - 1])
            if not self.is_driver:
                continue
            targets = torch.tensor(req.prompt_token_ids[1:], device=self.device)
            result[i] = compute_prompt_logprobs(logits, targets, num_top)
        return result
