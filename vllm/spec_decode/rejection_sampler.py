"""Verification of draft tokens against the target's distribution, one request at a time over
its m + 1 target rows (the rows of its last token and its m drafts, from ONE target forward).

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
from typing import Optional

import torch

from vllm.model_executor.sampler import Sampler, SamplingBatch


def _uniform(generator: Optional[torch.Generator], device: torch.device) -> float:
    return torch.rand(1, generator=generator, device=device).item()


def _draw(probs: torch.Tensor, generator: Optional[torch.Generator]) -> int:
    """One token from probs [vocab] by the exponential race (argmax of probs / Exp(1))."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / noise).argmax())


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
        penalised = Sampler.apply_penalties(logits, batch)
        probs = None if all(is_greedy) else Sampler.compute_probs(logits, batch)
        argmax = penalised.argmax(dim=-1).tolist()
        results = []
        row = 0
        for i, draft in enumerate(drafts):
            m = len(draft)
            if is_greedy[i]:
                results.append(self._greedy(draft, argmax[row:row + m + 1]))
            elif self.method == "typical_acceptance_sampler":
                results.append(self._typical(draft, probs[row:row + m + 1], generators[i]))
            else:
                results.append(self._rejection(draft, probs[row:row + m + 1], draft_probs[i],
                                               generators[i]))
            row += m + 1
        return results

    @staticmethod
    def _greedy(draft: list[int], target_argmax: list[int]) -> list[int]:
        out = []
        for x, t in zip(draft, target_argmax):
            if x != t:
                break
            out.append(x)
        out.append(target_argmax[len(out)])  # the correction, or the bonus token
        return out

    @staticmethod
    def _rejection(draft: list[int], q: torch.Tensor, p: Optional[torch.Tensor],
                   generator: Optional[torch.Generator]) -> list[int]:
        """q [m + 1, vocab] target probs; p [m, vocab] draft probs or None (one-hot)."""
        out = []
        if p is not None:
            p = p.to(q.device, q.dtype)
        for j, x in enumerate(draft):
            q_x = q[j, x].item()
            p_x = 1.0 if p is None else p[j, x].item()
            if p_x > 0 and _uniform(generator, q.device) < min(1.0, q_x / p_x):
                out.append(x)
                continue
            if p is None:
                residual = q[j].clone()
                residual[x] = 0.0
            else:
                residual = (q[j] - p[j]).clamp_min(0.0)
            if residual.sum() <= 0:  # q == p: any rejection leaves q itself
                residual = q[j]
            out.append(_draw(residual / residual.sum(), generator))
            return out
        out.append(_draw(q[len(draft)], generator))  # all accepted: the bonus token
        return out

    def _typical(self, draft: list[int], q: torch.Tensor,
                 generator: Optional[torch.Generator]) -> list[int]:
        entropy = -(q * q.clamp_min(1e-30).log()).sum(dim=-1)  # [m + 1]
        threshold = torch.clamp(self.posterior_alpha * torch.exp(-entropy),
                                max=self.posterior_threshold)
        out = []
        for j, x in enumerate(draft):
            if q[j, x] > threshold[j]:
                out.append(x)
            else:
                out.append(int(q[j].argmax()))
                return out
        out.append(_draw(q[len(draft)], generator))
        return out
