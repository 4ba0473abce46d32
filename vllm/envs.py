"""Every environment variable the project reads, in one place, read when asked (never cached at
import, so tests and launchers can set them late)."""
import os
from typing import Any, Callable


def _flag(raw: str) -> bool:
    if raw.lower() in ("1", "true", "on", "yes"):
        return True
    if raw.lower() in ("0", "false", "off", "no"):
        return False
    raise ValueError("expected 1/0, true/false, on/off or yes/no")


def _auto_flag(raw: str) -> str:
    """auto, or on/off (the spellings _flag takes)."""
    return "auto" if raw.lower() == "auto" else ("on" if _flag(raw) else "off")


def _gemv_rows(raw: str) -> int:
    """A row count 0..8, or on (8) / off (0) in the spellings _flag takes but 1 and 0."""
    if raw.strip().isdigit():
        if int(raw) > 8:
            raise ValueError("expected off, on or a row count from 0 to 8")
        return int(raw)
    return 8 if _flag(raw) else 0


def _blocks_per_sm(raw: str) -> int:
    if not raw.strip().isdigit() or not 1 <= int(raw) <= 64:
        raise ValueError("expected a whole number from 1 to 64")
    return int(raw)


def _positive_seconds(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= 60:
        raise ValueError("expected seconds, more than 0 and at most 60")
    return value


def _one_of(*choices: str) -> Callable[[str], str]:
    """A parser of one of choices (any case)."""
    def parse(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(f"expected {' or '.join(choices)}")
        return raw.lower()
    return parse


# name -> (parser, default, description)
_VARIABLES: dict[str, tuple[Callable[[str], Any], Any, str]] = {
    "VLLM_TARGET_DEVICE": (str.lower, "auto",
                           "build: auto, cpu or cuda kernels in vllm._C (setup.py)"),
    "VLLM_CPU_ISA": (str.lower, "auto", "build: auto, avx512, avx2 or scalar CPU kernels"),
    "VLLM_CPU_KVCACHE_SPACE": (float, 4.0, "GiB of host memory for a CPU KV cache"),
    "VLLM_CPU_NUM_THREADS": (int, 0, "threads for CPU work; 0 keeps torch's default"),
    "VLLM_CPU_DECODE_PATH": (str.lower, "fused",
                             "CPU steps of at most 64 rows: fused (one decode_layers call per "
                             "step) or native (one op per layer piece, the reference)"),
    "VLLM_CPU_GEMV_STREAMS": (_one_of("1", "2"), "2",
                              "the CPU GEMV of 1 or 2 rows in bf16 (read by the kernel at each "
                              "call): 2 reads each thread's weight rows as its two halves side "
                              "by side, 1 as one stream (2-core Zen 4, SmolLM2-135M forward: "
                              "5% faster at 2 threads, 12% at 1; the GEMV at 2 rows 11-28% "
                              "faster; paired runs)"),
    "VLLM_CPU_PACKED_WEIGHTS": (_flag, True,
                                "bf16 CPU linears of the fused decode path (and the logits) "
                                "also keep a copy of each weight packed for register tiles "
                                "without horizontal sums, used from 2 rows where the CPU has "
                                "AVX512_BF16: costs the linear weights' bytes again in memory"),
    "VLLM_CPU_AMX": (_one_of("0", "auto", "all"), "auto",
                     "bf16 CPU linears of few rows on AMX tiles where the CPU has them (read by "
                     "the kernel at each call): 0 never, auto (default) 8 to 16 rows (to 64 on "
                     "the weights' packed copies), all 1 to 16 (64) (H200 host, a draft step's "
                     "matrices: 0.40-0.89x the AVX512 kernels' time at 8-16 rows, 0.93-1.4x at "
                     "1-4)"),
    "VLLM_CPU_AMX_PREFETCH": (_one_of("0", "1", "l1"), "l1",
                              "the packed AMX tiles prefetch each weight stream two k-steps "
                              "ahead, into the thread's next panels at a pass's end (read by "
                              "the kernel at each call): l1 (default) into L1, 1 into L2, 0 "
                              "off (an H100 machine's 16-core host: draft-20m's batch-8 "
                              "forward 0.96-0.97x the time with l1 than 1; SmolLM2-135M's "
                              "5.3-5.6% faster with 1 than 0)"),
    "VLLM_CPU_PACKED_GRAIN_KB": (int, 8,
                                 "KB of weights a thread takes at least of a packed linear's "
                                 "loop (read by the kernel at each call; 1 to 4096, default 8): "
                                 "less spreads a small matrix over more threads (draft-20m's "
                                 "batch-8 forward 0.97-0.99x the time at 8 than at 32)"),
    "VLLM_CPU_AMX_KEEP_TILES": (_one_of("0", "1"), "0",
                                "1 leaves a packed AMX linear's threads with their tiles "
                                "configured between loops (no tilerelease; ldtilecfg only where "
                                "a thread's configuration differs), 0 (default) configures and "
                                "releases them in every loop (read by the kernel at each call; "
                                "1: draft-20m's batch-8 forward 0.98-0.99x the time on one "
                                "16-core host, 0.99-1.06x on another, where the larger drafts' "
                                "took 1.00-1.11x)"),
    "VLLM_CPU_AMX_INPUT_AHEAD": (int, 4,
                                 "k-steps ahead at which the packed AMX tiles prefetch their "
                                 "input rows' lines into L1 (read by the kernel at each call; 0 "
                                 "to 64, default 4; 0: off). The rows are lines other cores "
                                 "wrote in the loop before (4: draft-20m's batch-8 forward "
                                 "0.95-0.98x the time of 0 in three rounds on one 16-core host)"),
    "VLLM_CPU_DECODE_SPLIT_ELEMS": (int, 2048,
                                    "elements a thread from which decode_layers splits its "
                                    "norms, silu_and_mul and rotary over the threads (read by "
                                    "the kernel at each call; 0: 32K, as the ops outside it). "
                                    "2-core AMX Xeon, SmolLM2-135M batch 8: those ops 1.3x "
                                    "faster, the forward even; meant for many-core hosts, where "
                                    "they ran on one of 16 threads"),
    "VLLM_CPU_DECODE_TEAM": (_one_of("0", "1"), "1",
                             "decode_layers runs its whole step in one parallel region: the "
                             "calling thread runs the step and hands each kernel loop to the "
                             "region's other threads, which spin between loops (read by the "
                             "kernel at each call; 0: a region per loop). 16-core Xeon host, "
                             "batch 1 at 16 threads: SmolLM2-135M 3.375 -> 2.489 ms, draft-20m "
                             "0.455 -> 0.362"),
    "VLLM_CPU_DECODE_FOLD": (_one_of("0", "1"), "1",
                             "decode_layers folds rotary and the cache write into the "
                             "attention's tasks (each rotates its own query heads and writes "
                             "the new keys it reads), and, where every linear of the step runs "
                             "the packed bf16 tiles, its norms into the qkv and gate/up "
                             "linears' loops (VLLM_CPU_FOLD_SHARE says by which threads) "
                             "and silu_and_mul into gate/up's (each task finishes its own "
                             "columns) (read by the kernel at each call; 0: each op its own "
                             "loop): 5 hand-overs between cores a layer instead of 10, the same "
                             "bits"),
    "VLLM_CPU_ATTENTION_TAIL": (_one_of("0", "1"), "1",
                                "where decode_layers folds the attention and a team runs the "
                                "step, the attention's parts run as the tail of the qkv "
                                "linear's loop: once every qkv chunk is done, each thread runs "
                                "its share of them before it reports done (read by the kernel "
                                "at each call; 0: a loop of its own, one more hand-over between "
                                "cores a layer), the same bits"),
    "VLLM_CPU_NORM_TAIL": (_one_of("0", "1"), "1",
                           "where decode_layers folds and shares the norms and a team runs the "
                           "step, each norm after a layer's first is normalised as the tail of "
                           "the o or down loop before its linear (each thread its share of the "
                           "rows) instead of by claims and a wait inside the linear's loop (read "
                           "by the kernel at each call; 0: in the linear's loop), the same bits. "
                           "A 20M draft's batch-8 forward 3% faster on a 16-core Xeon host"),
    "VLLM_CPU_AVX2_TILES": (_one_of("0", "1"), "1",
                            "the AVX2 build's bf16 linears of 8-64 input rows on register tiles "
                            "(3 weight rows x 4 input rows, each weight vector converted once "
                            "for 4 rows) instead of the GEMV's passes of 4 rows (read by the "
                            "kernel at each call; 0: the GEMV). SmolLM2-135M's matrices 0.85-"
                            "0.88x the time at 8 rows, 0.66-0.67x at 16 on a 2-core EPYC"),
    "VLLM_CPU_AVX512_TILES": (_one_of("0", "1"), "1",
                              "the AVX-512 build's bf16 linears of 1-64 input rows, on CPUs "
                              "without AVX512_BF16, on register tiles (4 weight rows x 6 input "
                              "rows, each weight vector converted once for 6 rows) instead of "
                              "the GEMV's passes (read by the kernel at each call; 0: the "
                              "GEMV; before, torch's GEMM took 9-64 rows). Qwen2.5-1.5B's "
                              "matrices at 20 rows 5.77 -> 2.98x their floor, 1 row 1.32 -> "
                              "1.00x, on a 2-core AVX-512 Xeon"),
    "VLLM_CPU_FOLD_SHARE": (_one_of("0", "1"), "1",
                            "where decode_layers folds a norm into a linear's loop, the rows "
                            "are normalised once, each by a thread that claims it, into a "
                            "buffer the loop's threads share once all are done (read by the "
                            "kernel at each call; 0: each thread normalises every row for "
                            "itself, 8 rows' work a thread at batch 8), the same bits. "
                            "SmolLM2-135M's batch-8 draft forward 8.4% and 3.9% faster on two "
                            "16-core Xeon hosts"),
    "VLLM_CPU_GREEDY_STEP": (_one_of("0", "1"), "1",
                             "a CPU draft's plain-greedy one-token steps run the embedding, "
                             "decode_layers and linear_argmax directly instead of through the "
                             "model's modules and the sampler (the same ops and bits; read at "
                             "each draft step; 0: through the model)"),
    "VLLM_CUDA_GEMV": (_gemv_rows, 8,
                       "CUDA linear layers and logits of few rows use vllm._C's linear_small "
                       "GEMV instead of torch's GEMM: off, on (steps of up to 8 rows, the "
                       "default) or the most rows, 1 to 8 (H100, a 7B step in a CUDA graph: "
                       "1 row 4.47 ms against cuBLAS's 5.14 over the weights alone; 3 and 5 "
                       "rows, the tensor-core kernel, 5.65 and 5.86 ms a step against 5.85 "
                       "and 6.11 with cuBLAS, which splits K and adds reduce kernels)"),
    "VLLM_CUDA_ATTN_PARTS": (_one_of("max", "context"), "max",
                             "CUDA paged attention's key partitions (read by the kernel at each "
                             "call): max sizes them on the host for max_context_len, as a CUDA "
                             "graph captures them; context sizes them per sequence on the device "
                             "from its own context (a short context over as many blocks as a "
                             "long one; tested on the H200, its speed not yet measured); the "
                             "cluster merge (VLLM_CUDA_ATTN_COMBINE) always sizes them per "
                             "sequence"),
    "VLLM_CUDA_ATTN_COMBINE": (_one_of("cluster", "last-block", "kernel"), "cluster",
                               "how CUDA paged attention merges its key partitions (read by the "
                               "kernel at each call): cluster (the default; sm_90 and later: "
                               "each query tile's partitions, at most 8, run as one "
                               "thread-block cluster and merge through its shared memory; "
                               "elsewhere as last-block), last-block (the last block of each "
                               "query tile to finish merges them, one launch) or kernel (a "
                               "second launch, the combine kernel)"),
    "VLLM_CUDA_ATTN_BLOCKS_PER_SM": (_blocks_per_sm, 4,
                                     "CUDA paged attention splits each sequence's keys into "
                                     "enough partitions for about this many blocks per SM "
                                     "(read by the kernel at each call; 1 to 64)"),
    "VLLM_CUDA_PDL": (_one_of("0", "1"), "0",
                      "vllm._C's CUDA kernels launched with programmatic dependent launch (sm_90 "
                      "and later; read at every launch): each lets the next kernel start early "
                      "and waits for the one before it, and linear_small requests its weight "
                      "rows into L2 before waiting, so the weights stream while the small "
                      "kernels between a decode step's GEMVs run (H100: no gain, a 7B "
                      "batch-1 step 5.107 -> 5.199 ms; hence off)"),
    "VLLM_FUSED_ROTARY_CACHE": (_flag, True,
                                "the attention layers rotate queries and keys and write the "
                                "paged cache in one vllm._C call (one CUDA launch instead of "
                                "two); off: rotary_embedding, then reshape_and_cache"),
    "VLLM_CPU_TRACE_FILE": (str, "",
                            "a file to which the CPU decode step's threads append a timeline "
                            "(hand-overs, stage marks, a folded norm's wait, a packed "
                            "linear's tiles; read by the extension once a process; "
                            "benchmarks/lab/cpu_step_trace.py reads it); unset: none"),
    "VLLM_MODEL_CACHE": (str, "", "where fetched GGUF models are cached; default "
                         "~/.cache/vllm-hetero/models"),
    "VLLM_LOGGING_LEVEL": (str.upper, "INFO", "log level of the vllm logger"),
    "VLLM_DRAFTER_SPIN": (_auto_flag, "auto",
                          "the draft process busy-waits while proposals come (its torch "
                          "threads and its main thread, for VLLM_DRAFTER_SPIN_IDLE_S after "
                          "the last one) instead of sleeping between them: auto (when it is "
                          "pinned to cores of its own: a GPU target, 4+ cores), on, off; "
                          "where it spins, the engine polls for its answers as long before "
                          "sleeping on the pipe"),
    "VLLM_DRAFTER_SPIN_IDLE_S": (_positive_seconds, 0.05,
                                 "how long a spinning draft process keeps busy-waiting after "
                                 "its last proposal before it sleeps (its torch threads about "
                                 "as long): long enough to span a verification step, short "
                                 "enough that it rests while the goodput controller decodes "
                                 "plainly"),
}


def __getattr__(name: str) -> Any:
    if name not in _VARIABLES:
        raise AttributeError(f"vllm.envs has no variable {name!r}")
    parse, default, _ = _VARIABLES[name]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={raw!r} is invalid: {e}") from e


def __dir__() -> list[str]:
    return list(_VARIABLES)
