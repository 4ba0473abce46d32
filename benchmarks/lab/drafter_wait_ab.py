"""The engine's wait for a draft process's answer, polled busily or asleep on the pipe, in
turns: a batch-1 greedy generation through the engine (the target on the GPU where there is
one, else on the CPU with one thread), its CPU draft in a pinned draft process, k drafts a step.
Per round, each mode generates the same prompt; per mode: the engine's wait for drafts a step
(draft_ms), the drafter's own computing in it (busy_ms: its proposals' seconds), and the rest
(messaging and waking up); the target's verification a step for reference. Dummy weights
unless the directories hold real ones (--load-format auto).

    python benchmarks/lab/drafter_wait_ab.py TARGET_DIR DRAFT_DIR [K] [ROUNDS] [TOKENS]
Environment: LOAD_FORMAT (dummy), DRAFT_CPUS (the drafter's cores; default: the engine's pick
beside a GPU, else the last core)."""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.spec_decode.metrics import SpecDecodeMetrics  # noqa: E402

target, draft = sys.argv[1], sys.argv[2]
k = int(sys.argv[3]) if len(sys.argv) > 3 else 1
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 6
tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 128
on_gpu = torch.cuda.is_available()
cpus = os.environ.get("DRAFT_CPUS") or (None if on_gpu else str(max(os.sched_getaffinity(0))))
if not on_gpu:
    torch.set_num_threads(1)
llm = LLM(model=target, speculative_model=draft, num_speculative_tokens=k,
          cpu_draft_worker=True, speculative_draft_process="on", speculative_draft_cpus=cpus,
          load_format=os.environ.get("LOAD_FORMAT", "dummy"), dtype="bfloat16",
          max_model_len=1024, speculative_adaptive="off", speculative_draft_ahead="off")
engine = llm.llm_engine
proposer = engine.proposer
assert proposer.spins, "the drafter does not spin (not pinned?): nothing to compare"
prompt = {"prompt_token_ids": list(range(100, 356))}
params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
llm.generate([prompt], params, use_tqdm=False)  # warm-up
rows: dict = {"polled": [], "asleep": []}
outputs: dict = {}
for r in range(rounds):
    for mode in (("polled", "asleep") if r % 2 == 0 else ("asleep", "polled")):
        proposer.spins = mode == "polled"  # the engine's side only: the drafter spins either way
        engine.spec_metrics = m = SpecDecodeMetrics()
        out = llm.generate([prompt], params, use_tqdm=False)
        outputs.setdefault(mode, out[0].outputs[0].token_ids)
        calls = max(m.num_propose_calls, 1)
        rows[mode].append((1e3 * m.draft_time_s / calls, 1e3 * m.drafter_busy_s / calls,
                           1e3 * m.verify_time_s / max(m.num_verify_forwards, 1),
                           m.mean_accepted_length))
proposer.spins = True
assert outputs["polled"] == outputs["asleep"], "the two modes generated different tokens"
print(f"k = {k}, {tokens} tokens x {rounds} rounds a mode, target on "
      f"{'cuda' if on_gpu else 'cpu'}, drafter cores {proposer.cpus}; medians of the rounds, "
      "ms a step:")
for mode, v in rows.items():
    med = [statistics.median(x[i] for x in v) for i in range(4)]
    print(f"  {mode:<7} draft wait {med[0]:.3f} (drafter busy {med[1]:.3f}, rest "
          f"{med[0] - med[1]:.3f}), verification {med[2]:.3f}, tau {med[3]:.2f}")
