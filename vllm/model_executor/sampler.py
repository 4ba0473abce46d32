"""The sampler: from one step's logits (one row per sequence that samples) to each row's next
token, with vLLM's penalties, temperature, min_p / top_k / top_p filters, per-request seeds and
logprobs. Plain torch, so the same code runs on CPU and CUDA tensors."""
import itertools
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn

from vllm.sampling_params import SamplingParams

# A token is dropped by top_p once the mass ranked ahead of it reaches top_p within this relative
# slack, so a mass that equals top_p on paper is not undone by fp32 rounding in softmax/cumsum.
_TOP_P_RTOL = 1e-6

# rows of the [8, num_seqs] tensor build() packs, so that it makes one host-to-device copy
_TEMPERATURE, _TOP_P, _MIN_P, _TOP_K, _PRESENCE, _FREQUENCY, _REPETITION, _GREEDY = range(8)


@dataclass
class SamplingBatch:
    """One step's sampling parameters as per-row tensors; a None tensor means no row uses it."""
    num_seqs: int = 0  # rows of the logits
    vocab_size: int = 0  # columns of the logits
    temperature: Optional[torch.Tensor] = None  # [num_seqs] fp32; 1.0 on greedy rows
    is_greedy: Optional[torch.Tensor] = None  # [num_seqs] bool
    all_greedy: bool = False  # every row is greedy: argmax only, no probabilities
    all_random: bool = False  # no row is greedy: no argmax merge
    top_p: Optional[torch.Tensor] = None  # [num_seqs] fp32, 1.0 where off; None: all off
    top_k: Optional[torch.Tensor] = None  # [num_seqs] int64, vocab_size where off; None: all off
    max_top_k: int = 0  # largest top_k in use (< vocab_size); bounds torch.topk
    min_p: Optional[torch.Tensor] = None  # [num_seqs] fp32, 0.0 where off; None: all off
    presence_penalties: Optional[torch.Tensor] = None  # [num_seqs] fp32; None: all 0
    frequency_penalties: Optional[torch.Tensor] = None  # [num_seqs] fp32; None: all 0
    repetition_penalties: Optional[torch.Tensor] = None  # [num_seqs] fp32; None: all 1
    # [num_seqs, vocab_size] fp32: occurrences in the output; left 0 on rows without penalties
    output_token_counts: Optional[torch.Tensor] = None
    # [num_seqs, vocab_size] bool: in the prompt; left False on rows without repetition_penalty
    prompt_token_mask: Optional[torch.Tensor] = None
    banned_rows: Optional[torch.Tensor] = None  # [num_banned] int64: min_tokens ban, the rows
    banned_token_ids: Optional[torch.Tensor] = None  # [num_banned] int64: and their tokens
    # per row: its own torch.Generator, or None for the device's default generator
    generators: list[Optional[torch.Generator]] = field(default_factory=list)
    seeded_rows: list[int] = field(default_factory=list)  # rows that have their own generator
    unseeded_rows: Optional[torch.Tensor] = None  # [num_unseeded] int64; set when some are seeded
    max_num_logprobs: Optional[int] = None  # most top logprobs a row asked for; None: none asked

    @property
    def no_penalties(self) -> bool:
        return (self.presence_penalties is None and self.frequency_penalties is None
                and self.repetition_penalties is None)

    @classmethod
    def build(cls, params: Sequence[SamplingParams], prompt_token_ids: Sequence[Sequence[int]],
              output_token_ids: Sequence[Sequence[int]],
              generators: Sequence[Optional[torch.Generator]], vocab_size: int,
              device: Union[torch.device, str], eos_token_id: Optional[int] = None
              ) -> "SamplingBatch":
        """Row i samples with params[i], has generated output_token_ids[i] after
        prompt_token_ids[i], and draws from generators[i] (None: the device's default one,
        which must then be on `device`, as must every generator)."""
        num_seqs = len(params)
        for name, rows in (("prompt_token_ids", prompt_token_ids),
                           ("output_token_ids", output_token_ids), ("generators", generators)):
            if len(rows) != num_seqs:
                raise ValueError(f"{name} must have one entry per params row ({num_seqs}), "
                                 f"got {len(rows)}")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        device = torch.device(device)

        columns: list[list[float]] = [[] for _ in range(8)]
        for p in params:
            greedy = p.is_greedy
            top_k = p.top_k if 0 < p.top_k < vocab_size and not greedy else vocab_size
            columns[_TEMPERATURE].append(1.0 if greedy else p.temperature)
            columns[_TOP_P].append(1.0 if greedy else p.top_p)
            columns[_MIN_P].append(0.0 if greedy else p.min_p)
            columns[_TOP_K].append(top_k)
            columns[_PRESENCE].append(p.presence_penalty)
            columns[_FREQUENCY].append(p.frequency_penalty)
            columns[_REPETITION].append(p.repetition_penalty)
            columns[_GREEDY].append(1.0 if greedy else 0.0)
        # fp32 holds every top_k exactly: vocabularies are far below 2**24
        scalars = torch.tensor(columns, dtype=torch.float32).to(device)  # [8, num_seqs]

        num_greedy = int(sum(columns[_GREEDY]))
        used_top_k = [k for k in columns[_TOP_K] if k < vocab_size]
        use_presence = any(v != 0.0 for v in columns[_PRESENCE])
        use_frequency = any(v != 0.0 for v in columns[_FREQUENCY])
        use_repetition = any(v != 1.0 for v in columns[_REPETITION])
        batch = cls(
            num_seqs=num_seqs, vocab_size=vocab_size,
            temperature=scalars[_TEMPERATURE], is_greedy=scalars[_GREEDY] > 0.5,
            all_greedy=num_greedy == num_seqs, all_random=num_greedy == 0,
            top_p=scalars[_TOP_P] if any(v < 1.0 for v in columns[_TOP_P]) else None,
            top_k=scalars[_TOP_K].long() if used_top_k else None,
            max_top_k=int(max(used_top_k, default=0)),
            min_p=scalars[_MIN_P] if any(v > 0.0 for v in columns[_MIN_P]) else None,
            presence_penalties=scalars[_PRESENCE] if use_presence else None,
            frequency_penalties=scalars[_FREQUENCY] if use_frequency else None,
            repetition_penalties=scalars[_REPETITION] if use_repetition else None,
            generators=list(generators),
            max_num_logprobs=max((p.logprobs for p in params if p.logprobs is not None),
                                 default=None),
        )

        if use_presence or use_frequency or use_repetition:
            # rows with neutral penalties are left at zero: nothing reads their counts
            rows = [i for i, p in enumerate(params) if p.presence_penalty != 0.0
                    or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0]
            batch.output_token_counts = torch.zeros(num_seqs, vocab_size, dtype=torch.float32,
                                                    device=device)
            index = _flat_index(rows, output_token_ids, vocab_size, "output_token_ids", device)
            batch.output_token_counts.view(-1).index_put_(
                (index,), torch.ones((), dtype=torch.float32, device=device), accumulate=True)
        if use_repetition:
            rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
            batch.prompt_token_mask = torch.zeros(num_seqs, vocab_size, dtype=torch.bool,
                                                  device=device)
            index = _flat_index(rows, prompt_token_ids, vocab_size, "prompt_token_ids", device)
            batch.prompt_token_mask.view(-1)[index] = True

        banned_rows, banned_ids = [], []
        for i, p in enumerate(params):
            if len(output_token_ids[i]) >= p.min_tokens:
                continue
            # as in vLLM, EOS is not a stop token for ignore_eos requests, so it stays allowed
            stops = set(p.stop_token_ids)
            if eos_token_id is not None and not p.ignore_eos:
                stops.add(eos_token_id)
            # an id outside the vocabulary can never be sampled: nothing to ban
            stops = sorted(t for t in stops if 0 <= t < vocab_size)
            banned_rows += [i] * len(stops)
            banned_ids += stops
        if banned_rows:
            batch.banned_rows = torch.tensor(banned_rows, dtype=torch.long).to(device)
            batch.banned_token_ids = torch.tensor(banned_ids, dtype=torch.long).to(device)

        batch.seeded_rows = [i for i, g in enumerate(generators) if g is not None]
        if batch.seeded_rows and len(batch.seeded_rows) < num_seqs:
            unseeded = [i for i, g in enumerate(generators) if g is None]
            batch.unseeded_rows = torch.tensor(unseeded, dtype=torch.long).to(device)
        return batch


def _flat_index(rows: list[int], token_ids: Sequence[Sequence[int]], vocab_size: int, name: str,
                device: torch.device) -> torch.Tensor:
    """row * vocab_size + token for every token of the given rows: one index for one scatter
    into a flattened [num_seqs * vocab_size] view."""
    lengths = np.fromiter((len(token_ids[i]) for i in rows), dtype=np.int64, count=len(rows))
    # numpy's fromiter is the cheapest way from nested Python ints to one array
    flat = np.fromiter(itertools.chain.from_iterable(token_ids[i] for i in rows), dtype=np.int64,
                       count=int(lengths.sum()))  # [num_tokens]
    if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        bad = flat[(flat < 0) | (flat >= vocab_size)][0]
        raise ValueError(f"{name} holds token id {bad}, outside [0, vocab_size={vocab_size})")
    flat += np.repeat(np.asarray(rows, dtype=np.int64) * vocab_size, lengths)
    return torch.from_numpy(flat).to(device)


@dataclass
class LogprobsTensors:
    """Logprobs of one token per row (the chosen one) and of the row's most likely tokens."""
    logprob_token_ids: Optional[torch.Tensor] = None  # [num_rows, num_top + 1] int64: chosen, top
    logprobs: Optional[torch.Tensor] = None  # [num_rows, num_top + 1] fp32, same order
    selected_token_ranks: Optional[torch.Tensor] = None  # [num_rows] int64: 1 = most likely


@dataclass
class SamplerOutput:
    """One step's result: a token per row, and logprobs when some row asked for them."""
    sampled_token_ids: Optional[torch.Tensor] = None  # [num_seqs] int64
    logprobs: Optional[LogprobsTensors] = None  # num_top = the batch's max_num_logprobs
    # [num_seqs] bool: rows whose logits or probabilities were not finite (NaN, +inf, nothing
    # sampleable); their token is 0 and meaningless, and the caller fails their requests
    nonfinite_rows: Optional[torch.Tensor] = None


def compute_prompt_logprobs(logits: torch.Tensor, target_ids: torch.Tensor,
                            num_top: int) -> LogprobsTensors:
    """Logprobs (log_softmax of the raw logits) of target_ids and of the num_top likeliest."""
    if num_top < 0:
        raise ValueError(f"num_top must be >= 0, got {num_top}")
    logprobs = logits.float().log_softmax(dim=-1)  # [num_rows, vocab_size]
    target_ids = target_ids.long()
    chosen = logprobs.gather(-1, target_ids[:, None])  # [num_rows, 1]
    # rank as vLLM counts it: 1 + the tokens strictly more likely than the chosen one
    ranks = (logprobs > chosen).sum(dim=-1) + 1  # [num_rows]
    top = logprobs.topk(min(num_top, logprobs.shape[-1]), dim=-1)
    return LogprobsTensors(logprob_token_ids=torch.cat([target_ids[:, None], top.indices], dim=1),
                           logprobs=torch.cat([chosen, top.values], dim=1),
                           selected_token_ranks=ranks)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) of a [rows, vocab] tensor: the first maximal index of each row, a NaN
    counting as the maximum. On the CPU through numpy, which gives the same indices: torch's CPU
    argmax took 56 us over a 32000-token row against numpy's 4.5, and it splits a few rows over
    the thread pool, a barrier each (2-8 rows on 2 threads beside another busy process: 4-8 ms)."""
    if x.device.type != "cpu" or x.dim() != 2 or x.dtype not in _NUMPY_ARGMAX_DTYPES:
        return x.argmax(dim=-1)
    if x.dtype == torch.bfloat16:  # numpy has no bf16; the fp32 copy is exact
        x = x.float()
    return torch.from_numpy(x.numpy().argmax(axis=-1).astype(np.int64, copy=False))


_NUMPY_ARGMAX_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class Sampler(nn.Module):
    """Stateless; every method takes the step's SamplingBatch and leaves the logits untouched."""

    def forward(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        return self.sample(logits, batch)

    @staticmethod
    def sample(logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """Greedy rows: argmax of the penalised logits; the rest: a draw from compute_probs."""
        _check_shape(logits, batch)
        raw = logits.float()  # [num_seqs, vocab_size]
        penalised = Sampler.apply_penalties(raw, batch)
        bad = nonfinite_logit_rows(penalised)  # [num_seqs] bool
        if batch.all_greedy:
            sampled = argmax_rows(penalised)
        else:
            probs = Sampler.probs_from_penalised(penalised, batch)
            sampled = Sampler.sample_from_probs(probs, batch)
            random_bad = nonfinite_prob_rows(probs)
            if not batch.all_random:
                sampled = torch.where(batch.is_greedy, argmax_rows(penalised), sampled)
                random_bad &= ~batch.is_greedy
            bad |= random_bad
        # a bad row's argmax may point at a NaN anywhere: keep its token in the vocabulary
        sampled = sampled.masked_fill(bad, 0)
        logprobs = None
        if batch.max_num_logprobs is not None:
            logprobs = compute_prompt_logprobs(raw, sampled, batch.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs, nonfinite_rows=bad)

    @staticmethod
    def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The min_tokens ban (stop tokens to -inf), then repetition, frequency and presence
        penalties; returns new logits [num_seqs, vocab_size] (the input itself if none apply)."""
        _check_shape(logits, batch)
        if batch.banned_rows is None and batch.no_penalties:
            return logits
        logits = logits.float().clone()
        if batch.banned_rows is not None:
            logits.index_put_((batch.banned_rows, batch.banned_token_ids),
                              torch.full((), float("-inf"), device=logits.device))
        if batch.no_penalties:
            return logits
        counts = batch.output_token_counts  # [num_seqs, vocab_size]
        in_output = counts > 0
        if batch.repetition_penalties is not None:
            seen = batch.prompt_token_mask | in_output
            penalty = torch.where(seen, batch.repetition_penalties[:, None], 1.0)
            # dividing a positive logit and multiplying a negative one both make the token rarer
            logits = torch.where(logits > 0, logits / penalty, logits * penalty)
        if batch.frequency_penalties is not None:
            logits.addcmul_(counts, batch.frequency_penalties[:, None], value=-1.0)
        if batch.presence_penalties is not None:
            logits.addcmul_(in_output.float(), batch.presence_penalties[:, None], value=-1.0)
        return logits

    @staticmethod
    def compute_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Penalties, temperature, then min_p, top_k and top_p filtering, then softmax:
        probs [num_seqs, vocab_size] (greedy rows get temperature 1 and no filter)."""
        return Sampler.probs_from_penalised(Sampler.apply_penalties(logits, batch), batch)

    @staticmethod
    def sample_from_probs(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """One token per row [num_seqs] int64: argmax of probs / E with E ~ Exp(1), which picks
        token t with probability probs[t]. A row with its own generator draws its own E, so its
        token depends only on its probabilities and its generator. On the CPU, one uniform draw
        per row against its cumulative probabilities instead (_sample_inverse_cdf): the same
        distribution for a vocabulary's worth fewer random draws."""
        _check_shape(probs, batch)
        if probs.device.type == "cpu":
            return _sample_inverse_cdf(probs, batch)
        noise = _draws_per_row(batch, batch.vocab_size, torch.float32, probs.device,
                               lambda t, g: t.exponential_(generator=g))
        # a zero draw would make 0 / 0 = NaN, which argmax would pick
        noise.clamp_min_(torch.finfo(torch.float32).tiny)
        return probs.div(noise).argmax(dim=-1)

    @staticmethod
    def probs_from_penalised(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """compute_probs after apply_penalties: for a caller that also needs the penalised
        logits themselves (the draft's greedy rows beside its sampled ones)."""
        logits = logits / batch.temperature[:, None]
        probs = logits.softmax(dim=-1)  # [num_seqs, vocab_size]
        if batch.min_p is None and batch.top_k is None and batch.top_p is None:
            return probs
        # Every filter keeps the tokens at or above a per-row probability cutoff, so tokens tied
        # at a boundary are all kept or all dropped, whatever order a sort put them in.
        cutoff = None  # [num_seqs, 1]
        if batch.min_p is not None:
            cutoff = probs.amax(dim=-1, keepdim=True) * batch.min_p[:, None]
        if batch.top_p is not None:
            cutoff = _top_k_top_p_cutoff(probs, batch, cutoff)
        elif batch.top_k is not None:
            top = probs.topk(batch.max_top_k, dim=-1).values  # [num_seqs, max_top_k]
            kth = top.gather(-1, batch.top_k.clamp(max=batch.max_top_k)[:, None] - 1)
            # rows with top_k off hold vocab_size, beyond the max_top_k drawn: they keep all
            kth = torch.where(batch.top_k[:, None] <= batch.max_top_k, kth, 0.0)
            cutoff = kth if cutoff is None else torch.maximum(cutoff, kth)
        # a softmax again rather than dividing by the kept mass: a row that loses no token comes
        # out bit-identical to the unfiltered path, so a seeded row's draw cannot depend on
        # whether its neighbours asked for filters
        return logits.masked_fill(probs < cutoff, float("-inf")).softmax(dim=-1)


def _top_k_top_p_cutoff(probs: torch.Tensor, batch: SamplingBatch,
                        cutoff: Optional[torch.Tensor]) -> torch.Tensor:
    """The cutoff [num_seqs, 1] after top_k then top_p on the tokens that survive `cutoff`."""
    sorted_probs = probs.sort(dim=-1, descending=True).values  # [num_seqs, vocab_size]
    if batch.top_k is not None:
        kth = sorted_probs.gather(-1, batch.top_k[:, None] - 1)
        cutoff = kth if cutoff is None else torch.maximum(cutoff, kth)
    cumsum = sorted_probs.cumsum(dim=-1)  # [num_seqs, vocab_size]
    if cutoff is None:
        num_kept = torch.full_like(cumsum[:, :1], batch.vocab_size, dtype=torch.long)
    else:
        # the survivors are a prefix of the sorted row; >= 1 as the cutoff never exceeds the max
        num_kept = (sorted_probs >= cutoff).sum(dim=-1, keepdim=True)  # [num_seqs, 1]
    kept_mass = cumsum.gather(-1, num_kept - 1)  # [num_seqs, 1]
    # shifted rather than cumsum - sorted_probs, which rounding can make non-monotone
    mass_ahead = torch.nn.functional.pad(cumsum[:, :-1], (1, 0))  # [num_seqs, vocab_size]
    top_p = batch.top_p[:, None]
    # top_p on the renormalised survivors: token j stays while the mass ahead of it is < top_p
    needed = mass_ahead < top_p * kept_mass * (1.0 - _TOP_P_RTOL)
    num_needed = needed.sum(dim=-1, keepdim=True).clamp(min=1)
    num_needed = torch.where(top_p >= 1.0, num_kept, torch.minimum(num_needed, num_kept))
    return sorted_probs.gather(-1, num_needed - 1)


def nonfinite_logit_rows(logits: torch.Tensor) -> torch.Tensor:
    """[num_rows] bool: rows holding a NaN or +inf, or with every token at -inf (an argmax over
    them means nothing). -inf alone is fine: bans and filters put it there. One pass: a row's
    max is NaN if it holds a NaN, +inf if it holds +inf, -inf only if all of it is (three
    elementwise passes and their reductions cost 1.5 ms a step at 8 x 49152 on one core)."""
    return ~logits.amax(dim=-1).isfinite()


def nonfinite_prob_rows(probs: torch.Tensor) -> torch.Tensor:
    """[num_rows] bool: probability rows holding a NaN or inf, or without any mass. One pass: the
    entries are not negative, so a row's sum is finite and positive exactly when every entry is
    finite and one is positive (a vocabulary of entries at most 1 cannot overflow)."""
    total = probs.sum(dim=-1)
    return ~(total.isfinite() & (total > 0))


def _check_shape(logits: torch.Tensor, batch: SamplingBatch) -> None:
    if tuple(logits.shape) != (batch.num_seqs, batch.vocab_size):
        raise ValueError(f"logits must have shape [num_seqs={batch.num_seqs}, "
                         f"vocab_size={batch.vocab_size}], got {list(logits.shape)}")


def _sample_inverse_cdf(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """One token per row: the first token whose cumulative probability exceeds u * total, u ~
    U[0, 1) (a row with its own generator draws its u from it), which is token t with
    probability probs[t] / total; a zero-probability token is never picked. The sums are in
    float64, so a vocabulary's worth of float32 rounding stays far below one draw's resolution.
    One random number per row: on one CPU core an Exp(1) draw per vocabulary entry cost 9 ms a
    step for 8 rows of SmolLM2's 49152 tokens."""
    cdf = probs.to(torch.float64).cumsum_(dim=-1)  # [num_seqs, vocab_size]
    u = _draws_per_row(batch, 1, torch.float64, probs.device,
                       lambda t, g: t.uniform_(generator=g))
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)
    return tokens.clamp_(max=probs.shape[1] - 1)


def _draws_per_row(batch: SamplingBatch, width: int, dtype: torch.dtype, device: torch.device,
                   draw: Callable[[torch.Tensor, Optional[torch.Generator]], torch.Tensor]
                   ) -> torch.Tensor:
    """[num_seqs, width] random numbers, draw(tensor, generator) filling them in place: a row
    with its own generator draws from it alone, the other rows share the default generator."""
    out = torch.empty(batch.num_seqs, width, dtype=dtype, device=device)
    if not batch.seeded_rows:
        return draw(out, None)
    if batch.unseeded_rows is not None:
        shared = torch.empty(batch.unseeded_rows.numel(), width, dtype=dtype, device=device)
        out[batch.unseeded_rows] = draw(shared, None)
    for row in batch.seeded_rows:
        draw(out[row], batch.generators[row])
    return out
