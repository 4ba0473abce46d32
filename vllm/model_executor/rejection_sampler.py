"""Verification of draft tokens against the target's distribution, one request at a time over
its m + 1 target rows (the rows of its last token and its m drafts, from ONE target forward); a
batch of greedy requests in one argmax over all rows.

Rejection sampling (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023): draft x_j drawn
from p_j is accepted with probability min(1, q_j(x_j) / p_j(x_j)), q_j being the target's
processed distribution at that position; at the first rejection a token is drawn from
normalize(max(0, q_j - p_j)); if all m are accepted a bonus token is drawn from q_m. The output is
distributed exactly as sampling from q alone. A deterministic proposal (greedy drafts, n-grams)
has p_j = one-hot(x_j). Greedy requests (temperature 0) accept while the draft equals the
target's argmax and then emit the argmax: token-for-token plain greedy decoding.

Typical acceptance (Cai et al. 2024, Medusa, arXiv 2401.10774) is the opt-in lossy alternative:
accept x_j while q_j(x_j) > min(epsilon, delta * exp(-H(q_j))); at the first refusal emit the
argmax of q_j."""
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from vllm.model_executor.sampler import Sampler, SamplingBatch, argmax_rows

PLACEHOLDER = -1  # pads draft_ids past a request's drafts


@dataclass
class VerificationInputs:
    """What a verification needs besides the target's logits, one entry per request: request i
    owns logits rows cu_num_drafts[i] + i .. cu_num_drafts[i + 1] + i (its last token and its
    drafts)."""
    drafts: list[list[int]]  # host copy, for the read-back
    # [num_requests, max_drafts] int64 on the logits' device, padded with PLACEHOLDER
    draft_ids: torch.Tensor
    cu_num_drafts: list[int]  # [num_requests + 1]: drafts before request i
    draft_probs: list[Optional[torch.Tensor]]  # [m_i, vocab] on the device, None: deterministic
    is_greedy: list[bool]
    generators: list[Optional[torch.Generator]]
    batch: Optional[SamplingBatch] = None  # one sampling row per logits row; None: all plain greedy

    @classmethod
    def build(cls, drafts: list[list[int]], draft_probs: list[Optional[torch.Tensor]],
              is_greedy: list[bool], generators: list[Optional[torch.Generator]],
              batch: Optional[SamplingBatch], device: torch.device) -> "VerificationInputs":
        """Copies the drafts (and their probs) to the device: done before the target's forward
        is launched, so that nothing in the verification waits for the device before its
        read-back."""
        width = max((len(d) for d in drafts), default=0)
        padded = [d + [PLACEHOLDER] * (width - len(d)) for d in drafts]
        draft_ids = torch.tensor(padded, dtype=torch.long).to(device, non_blocking=True)
        cu = [0]
        for d in drafts:
            cu.append(cu[-1] + len(d))
        probs = [p.to(device) if p is not None else None for p in draft_probs]
        return cls(drafts, draft_ids, cu, probs, is_greedy, generators, batch)


class RejectionSampler:

    def __init__(self, method: str = "rejection_sampler", posterior_threshold: float = 0.09,
                 posterior_alpha: float = 0.3) -> None:
        self.method = method
        self.posterior_threshold = posterior_threshold
        self.posterior_alpha = posterior_alpha

    def verify(self, logits: torch.Tensor, batch: SamplingBatch, drafts: list[list[int]],
               draft_probs: list[Optional[torch.Tensor]], is_greedy: list[bool],
               generators: list[Optional[torch.Generator]]) -> list[list[int]]:
        """logits [sum(m_i + 1), vocab]: request i's m_i + 1 rows in order, batch built for those
        rows. Returns per request its accepted drafts plus one target token."""
        inputs = VerificationInputs.build(drafts, draft_probs, is_greedy, generators, batch,
                                          logits.device)
        return self.verify_async(logits, inputs)()

    def verify_async(self, logits: torch.Tensor, inputs: VerificationInputs
                     ) -> Callable[[], list[list[int]]]:
        """Queues the device work of every request and returns the function that reads it back
        with one synchronisation (inputs already on logits' device: VerificationInputs.build)."""
        batch, drafts = inputs.batch, inputs.drafts
        if batch is None:  # plain greedy requests only: nothing changes the logits
            return self._greedy_batch(argmax_rows(logits), drafts)
        penalised = Sampler.apply_penalties(logits, batch)
        if all(inputs.is_greedy):
            return self._greedy_batch(argmax_rows(penalised), drafts)
        probs = Sampler.compute_probs(logits, batch)
        pending = []  # per request: (accepted [m] bool, candidates [m + 1]) on the device
        for i, draft in enumerate(drafts):
            m = len(draft)
            x = inputs.draft_ids[i, :m]
            row = inputs.cu_num_drafts[i] + i
            if inputs.is_greedy[i]:
                pending.append(self._greedy(x, penalised[row:row + m + 1]))
            elif self.method == "typical_acceptance_sampler":
                pending.append(self._typical(x, probs[row:row + m + 1], inputs.generators[i]))
            else:
                pending.append(self._rejection(x, probs[row:row + m + 1], inputs.draft_probs[i],
                                               inputs.generators[i]))
        flat_dev = torch.cat([torch.cat([a.long(), c]) for a, c in pending])

        def finish() -> list[list[int]]:
            flat = flat_dev.tolist()
            results, pos = [], 0
            for draft in drafts:
                m = len(draft)
                accepted, candidates = flat[pos:pos + m], flat[pos + m:pos + 2 * m + 1]
                pos += 2 * m + 1
                n = accepted.index(0) if 0 in accepted else m
                results.append(draft[:n] + [candidates[n]])  # the replacement, or the bonus
            return results
        return finish

    @staticmethod
    def _greedy_batch(argmax: torch.Tensor, drafts: list[list[int]]
                      ) -> Callable[[], list[list[int]]]:
        """Every request greedy: one argmax over all rows, read back once; each request keeps
        its drafts while they equal the target's argmax, then the argmax after them."""
        def finish() -> list[list[int]]:
            flat = argmax.tolist()
            results, row = [], 0
            for draft in drafts:
                m = len(draft)
                best = flat[row:row + m + 1]
                n = next((j for j in range(m) if draft[j] != best[j]), m)
                results.append(draft[:n] + [best[n]])
                row += m + 1
            return results
        return finish

    @staticmethod
    def _greedy(x: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Accept while the draft x [m] is the target's argmax; candidates are the argmaxes."""
        argmax = argmax_rows(logits)  # [m + 1]
        return argmax[:len(x)] == x, argmax

    @staticmethod
    def _rejection(x: torch.Tensor, q: torch.Tensor, p: Optional[torch.Tensor],
                   generator: Optional[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """x [m] drafts; q [m + 1, vocab] target probs; p [m, vocab] draft probs or None
        (one-hot). Candidates are drawn for every position (the residual at j < m, q at m) with
        independent noise; the one at the first rejection (or the bonus at m) is used."""
        m = len(x)
        rows = torch.arange(m, device=q.device)
        q_x = q[rows, x]
        if p is None:
            p_x = torch.ones_like(q_x)
            residual = q[:m].clone()
            residual[rows, x] = 0.0
        else:
            p = p.to(q.device, q.dtype)
            p_x = p[rows, x]
            residual = (q[:m] - p).clamp_min(0.0)
        u = torch.rand(m, generator=generator, device=q.device)
        accepted = (p_x > 0) & (u < torch.clamp(q_x / p_x.clamp_min(1e-30), max=1.0))
        mass = residual.sum(dim=-1, keepdim=True)
        # q == p at a position: a rejection there leaves q itself
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), q[:m])
        dist = torch.cat([residual, q[m:m + 1]])  # [m + 1, vocab]
        noise = torch.empty_like(dist).exponential_(generator=generator)
        return accepted, (dist / noise).argmax(dim=-1)

    def _typical(self, x: torch.Tensor, q: torch.Tensor,
                 generator: Optional[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        m = len(x)
        entropy = -(q * q.clamp_min(1e-30).log()).sum(dim=-1)  # [m + 1]
        threshold = torch.clamp(self.posterior_alpha * torch.exp(-entropy),
                                max=self.posterior_threshold)
        accepted = q[torch.arange(m, device=q.device), x] > threshold[:m]
        noise = torch.empty_like(q[m]).exponential_(generator=generator)
        bonus = (q[m] / noise).argmax().view(1)
        return accepted, torch.cat([q[:m].argmax(dim=-1), bonus])
