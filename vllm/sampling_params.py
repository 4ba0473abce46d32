"""SamplingParams: how one request picks its tokens and when it stops (vLLM's public fields,
names and defaults), checked once when built."""
import copy
import enum
import math
import numbers
from dataclasses import dataclass
from typing import Optional, Union

# temperatures below this are greedy; dividing logits by them would only amplify noise
SAMPLING_EPS = 1e-5


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class SamplingParams:
    n: int = 1  # output sequences to return for the prompt
    best_of: Optional[int] = None  # sequences to generate; only None or n (no ranking here)
    presence_penalty: float = 0.0  # subtracted once from tokens already in the output, [-2, 2]
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output, [-2, 2]
    repetition_penalty: float = 1.0  # divides (>0 logits) or multiplies seen tokens; 1 = off
    temperature: float = 1.0  # logits divisor; < 1e-5 means greedy
    top_p: float = 1.0  # keep the fewest most likely tokens with this mass, (0, 1]
    top_k: int = -1  # keep the k most likely tokens; -1 or 0 = all
    min_p: float = 0.0  # drop tokens below min_p * the top token's probability, [0, 1]
    seed: Optional[int] = None  # seeds this request's own generator: same seed, same tokens
    stop: Optional[Union[str, list[str]]] = None  # strings that end generation (becomes a list)
    stop_token_ids: Optional[list[int]] = None  # token ids that end generation (becomes a list)
    ignore_eos: bool = False  # keep generating past the EOS token
    max_tokens: Optional[int] = 16  # most tokens to generate; None = up to max_model_len
    min_tokens: int = 0  # EOS and stop_token_ids cannot be sampled before this many tokens
    logprobs: Optional[int] = None  # top logprobs to return per output token (plus the chosen)
    prompt_logprobs: Optional[int] = None  # top logprobs to return per prompt token
    detokenize: bool = True  # turn output tokens into text
    skip_special_tokens: bool = True  # leave special tokens out of the text
    spaces_between_special_tokens: bool = True  # put spaces around special tokens in the text
    include_stop_str_in_output: bool = False  # keep the matched stop string in the text

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if self.stop is not None else []
        self.stop_token_ids = list(self.stop_token_ids) if self.stop_token_ids is not None else []
        self._verify()
        if self.is_greedy:
            # filters cannot change an argmax; neutral values let batches skip them
            self.top_p, self.top_k, self.min_p = 1.0, -1, 0.0

    def _verify(self) -> None:
        _check_int("n", self.n)
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of must be None or equal to n={self.n}, got {self.best_of}")
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty",
                     "temperature", "top_p", "min_p"):
            _check_number(name, getattr(self, name))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k)
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None:
            _check_int("seed", self.seed)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        _check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value)
                if value < 0:
                    raise ValueError(f"{name} must be >= 0 or None, got {value}")
        if not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must hold strings, got {self.stop!r}")
        if "" in self.stop:
            raise ValueError(f"stop must not contain an empty string, got {self.stop!r}")
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                   for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must hold ints, got {self.stop_token_ids!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy on the raw logits: no penalty and no min_tokens ban changes them first."""
        return (self.is_greedy and self.presence_penalty == 0.0
                and self.frequency_penalty == 0.0 and self.repetition_penalty == 1.0
                and self.min_tokens == 0)

    @property
    def sampling_type(self) -> SamplingType:
        if self.is_greedy:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)


def _check_int(name: str, value: object) -> None:
    # bool is an int subclass, but True as a count or seed is a caller's mistake
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
