"""The CPU decode path (linear_small, decode_layers) against the per-op reference: the model's own
layers with F.linear, for Llama (GQA, MHA) and Qwen2 (q/k/v biases) shapes, fp32 and bf16, decode
and verification batches of 1 to 64 rows; plus torch.library.opcheck of both ops."""
import itertools
import os
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, Qwen2Config

from tests.utils import assert_close, check_strided_bf16_linear, has_avx512_bf16
from vllm import _custom_ops as ops
from vllm.forward_context import AttentionMetadata, set_forward_context
from vllm.model_executor import cpu_decode
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

pytestmark = pytest.mark.skipif(not ops.has_kernel("decode_layers", "cpu"),
                                reason="vllm._C without the CPU decode ops")
BLOCK = 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# m: the one- and two-stream GEMV (1-3), bf16's 4 x 6 register tiles with every count of rows
# left over (4-9, 11, 12, 14, 16, 19, 32, 64), the AVX2 GEMV's passes of 4 rows with a last
# pass of up to 6 (5, 6, 9, 10) (fp32 above 8 rows and bf16 above 64: torch's GEMM, which
# linear_small hands those to)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 19, 32, 64, 65])
# k: whole 2-vector steps (256, 576), one more vector plus a tail (100), a vector and a half
# (48), tails only (17, 1), long enough for the tiles at 4 rows with a tail (810); n: not a
# multiple of any tile (13, 257, 37), one row (1)
@pytest.mark.parametrize("n,k", [(768, 256), (13, 100), (1, 17), (257, 576), (33, 48), (7, 1),
                                 (37, 810)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_small(dtype, m, n, k, bias):
    torch.manual_seed(m * n + k)
    x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype) / k**0.5
    b = torch.randn(n, dtype=dtype) if bias else None
    out = torch.full((m, n), float("nan"), dtype=dtype)
    ops.linear_small(out, x, w, b)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert_close("linear_small", out.float(), ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 4, 8, 13])
def test_linear_small_strided_rows(dtype, m):
    """Input and out rows inside wider buffers (row stride > features), as decode_layers passes."""
    torch.manual_seed(m)
    x = torch.randn(m, 160, dtype=dtype)[:, 20:120]
    w = torch.randn(70, 100, dtype=dtype) / 10
    out_buf = torch.full((m, 90), float("nan"), dtype=dtype)
    out = out_buf[:, 10:80]
    ops.linear_small(out, x, w, None)
    assert_close("linear_small strided", out.float(), F.linear(x.float(), w.float()), dtype)
    assert out_buf[:, :10].isnan().all() and out_buf[:, 80:].isnan().all()


@pytest.mark.parametrize("streams", ["1", "2"])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("n,k", [(1, 576), (2, 100), (57, 576), (2048, 576)])
def test_linear_small_few_rows_in_one_or_two_streams(streams, m, n, k, monkeypatch):
    """A bf16 GEMV of 1 or 2 input rows reads each thread's weight rows as one stream or as its
    two halves side by side (VLLM_CPU_GEMV_STREAMS, read at every call): the same sums either
    way, odd weight row counts, a column tail and a bias included."""
    monkeypatch.setenv("VLLM_CPU_GEMV_STREAMS", streams)
    torch.manual_seed(n + m)
    x, w = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    b = torch.randn(n, dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    ops.linear_small(out, x, w / 24, b)
    assert_close("linear_small streams", out.float(),
                 F.linear(x.float(), (w / 24).float(), b.float()), torch.bfloat16)


@pytest.mark.parametrize("variable,value,message,rows", [
    ("VLLM_CPU_GEMV_STREAMS", "3", "VLLM_CPU_GEMV_STREAMS must be 1 or 2", 1),
    ("VLLM_CPU_AMX", "yes", "VLLM_CPU_AMX must be 0, auto or all", 4)])
def test_linear_small_settings_are_checked(variable, value, message, rows, monkeypatch):
    """A bad value of a setting the kernel reads at each call is an error naming it (the
    streams setting where the AVX512_BF16 GEMV reads it; the AMX one everywhere)."""
    if variable == "VLLM_CPU_GEMV_STREAMS" and not has_avx512_bf16():
        pytest.skip("the setting is read by the AVX512_BF16 GEMV")
    monkeypatch.setenv(variable, value)
    with pytest.raises(RuntimeError, match=message):
        ops.linear_small(torch.empty(rows, 32, dtype=torch.bfloat16),
                         torch.randn(rows, 64, dtype=torch.bfloat16),
                         torch.randn(32, 64, dtype=torch.bfloat16), None)


# the builds with register tiles for bf16 without bf16 dot products: their setting, first rows
CONVERT_TILES = {"avx2": ("VLLM_CPU_AVX2_TILES", 8), "avx512": ("VLLM_CPU_AVX512_TILES", 1)}


@pytest.mark.parametrize("tiles", ["0", "1"])
@pytest.mark.parametrize("m", [1, 2, 7, 8, 10, 11, 13, 64])
@pytest.mark.parametrize("n,k", [(13, 100), (768, 256), (37, 810)])
def test_linear_small_register_tiles_setting(tiles, m, n, k, monkeypatch):
    """The AVX2 build's bf16 register tiles from 8 rows (VLLM_CPU_AVX2_TILES) and the AVX-512
    build's from 1 on CPUs without AVX512_BF16 (VLLM_CPU_AVX512_TILES), each read at every
    call, 0: the GEMV's passes. Both settings match the reference, weight rows beyond whole
    tiles, passes of uneven rows and a column tail included; a bad value is an error naming
    the setting (read where the tiles apply)."""
    if ops.cpu_isa() not in CONVERT_TILES or has_avx512_bf16():
        pytest.skip("the tiles of a build without bf16 dot products (AVX2, AVX-512)")
    variable, first_rows = CONVERT_TILES[ops.cpu_isa()]
    monkeypatch.setenv(variable, tiles)
    torch.manual_seed(m + n)
    x, w = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    b = torch.randn(n, dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    ops.linear_small(out, x, w / k**0.5, b)
    assert_close("linear_small register tiles", out.float(),
                 F.linear(x.float(), (w / k**0.5).float(), b.float()), torch.bfloat16)
    if m >= first_rows:  # read where the tiles apply
        monkeypatch.setenv(variable, "yes")
        with pytest.raises(RuntimeError, match=f"{variable} must be 0 or 1"):
            ops.linear_small(out, x, w, b)


@pytest.mark.parametrize("amx", ["0", "auto", "all"])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 15, 16, 17])
# n: whole tiles of 16 weight rows, an odd count of them (5), a tail of 4 rows after them,
# fewer rows than a tile; k: multiples of the tile's 32 columns, one that is not (48)
@pytest.mark.parametrize("n,k", [(2048, 576), (80, 64), (100, 64), (12, 96), (64, 48)])
def test_linear_small_amx_setting(amx, m, n, k, monkeypatch):
    """bf16 rows through AMX tiles where the CPU has them (VLLM_CPU_AMX, read at every call:
    0 never, auto 8-16 rows, all 1-16; elsewhere every setting runs the GEMV): the reference's
    sums, strided input and out rows and a bias included. On AMX hosts "0" against "auto" is
    the tile path against the GEMV; both against F.linear in fp32."""
    monkeypatch.setenv("VLLM_CPU_AMX", amx)
    check_strided_bf16_linear("linear_small amx", ops.linear_small, m, n, k)


def test_linear_small_rejects_bad_shapes():
    with pytest.raises(RuntimeError, match="features"):
        ops.linear_small(torch.empty(2, 4), torch.randn(2, 8), torch.randn(4, 7), None)


SHAPES = {
    "llama-gqa": (LlamaForCausalLM, LlamaConfig, dict(num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=32)),
    "llama-mha": (LlamaForCausalLM, LlamaConfig, dict(num_attention_heads=2,
                                                      num_key_value_heads=2, head_dim=64)),
    "qwen2-bias": (Qwen2ForCausalLM, Qwen2Config, dict(num_attention_heads=4,
                                                       num_key_value_heads=1, head_dim=32)),
}


def make_model(shape: str, dtype: torch.dtype, intermediate_size: int = 200):
    cls, config_cls, heads = SHAPES[shape]
    config = config_cls(vocab_size=300, hidden_size=128, intermediate_size=intermediate_size,
                        num_hidden_layers=3, max_position_embeddings=256, rms_norm_eps=1e-5,
                        tie_word_embeddings=shape.startswith("qwen2"), **heads)
    torch.manual_seed(0)
    model = cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.2 if "norm" not in name else 0.1) + ("norm" in name))
    return model.to(dtype).eval(), config


def make_step(config, dtype, context_lens, q_lens):
    """Caches holding random K/V for each sequence's earlier tokens, and the metadata of a step
    feeding each sequence its last q_len tokens."""
    num_kv, head = config.num_key_value_heads, config.head_dim
    blocks_per_seq = max(-(-c // BLOCK) for c in context_lens)
    num_blocks = blocks_per_seq * len(context_lens) + 1
    caches = [(torch.randn(num_blocks, num_kv, BLOCK, head).to(dtype),
               torch.randn(num_blocks, num_kv, BLOCK, head).to(dtype))
              for _ in range(config.num_hidden_layers)]
    # sequence s owns blocks s * blocks_per_seq + 1 ... (block 0 unused), in reverse order
    tables = torch.tensor([[s * blocks_per_seq + blocks_per_seq - j for j in range(blocks_per_seq)]
                           for s in range(len(context_lens))], dtype=torch.int32)
    positions, slots = [], []
    for s, (c, q) in enumerate(zip(context_lens, q_lens)):
        for pos in range(c - q, c):
            positions.append(pos)
            slots.append(int(tables[s, pos // BLOCK]) * BLOCK + pos % BLOCK)
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    md = AttentionMetadata(torch.tensor(slots), tables, torch.tensor(context_lens, dtype=torch.int32),
                           torch.tensor(qsl, dtype=torch.int32), max(context_lens), list(q_lens),
                           False)
    return caches, md, torch.tensor(positions)


def run(model, caches, md, ids, positions, path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_DECODE_PATH", path)
    caches = [(k.clone(), v.clone()) for k, v in caches]
    with torch.inference_mode(), set_forward_context(md, caches):
        hidden = model(ids, positions)
        logits = model.compute_logits(hidden)
    return hidden, logits, caches


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("context_lens,q_lens", [
    ([7], [1]),  # one draft step
    ([9, 30, 2], [1, 1, 2]),  # 4 rows
    ([40, 3, 17, 64, 1, 22, 9, 31], [1] * 8),  # a batch of 8 decodes (bf16: register tiles)
    ([20, 35, 5], [5, 5, 5]),  # verification of 4 drafts each (15 rows; fp32: torch's GEMM)
    ([20, 35, 5, 9], [5] * 4),  # 20 rows (bf16 on AMX: two row groups; make demo's k = 4)
    ([33] * 4 + [12] * 4, [4] * 8),  # 32 rows
    ([30] * 8 + [9] * 8, [4] * 16),  # 64 rows, the largest the path takes
])
# packed: bf16 from 2 rows on the packed tiles (where the CPU has AVX512_BF16) or not
@pytest.mark.parametrize("packed", ["1", "0"])
def test_decode_layers_matches_per_op_path(shape, dtype, context_lens, q_lens, packed,
                                           monkeypatch):
    if packed == "0" and dtype == torch.float32:
        pytest.skip("fp32 weights never pack")
    monkeypatch.setenv("VLLM_CPU_PACKED_WEIGHTS", packed)
    model, config = make_model(shape, dtype)
    caches, md, positions = make_step(config, dtype, context_lens, q_lens)
    ids = torch.randint(0, config.vocab_size, (len(positions),),
                        generator=torch.Generator().manual_seed(1))
    ref_hidden, ref_logits, ref_caches = run(model, caches, md, ids, positions, "native",
                                             monkeypatch)
    hidden, logits, new_caches = run(model, caches, md, ids, positions, "fused", monkeypatch)
    assert_close("decode_layers", hidden.float(), ref_hidden.float(), dtype, tol_scale=2)
    assert_close("decode_layers logits", logits, ref_logits, dtype, tol_scale=2)
    for (k, v), (rk, rv) in zip(new_caches, ref_caches):
        assert_close("decode_layers kv", k.float(), rk.float(), dtype, tol_scale=2)
        assert_close("decode_layers kv", v.float(), rv.float(), dtype, tol_scale=2)
    if dtype == torch.float32:
        assert (logits.argmax(-1) == ref_logits.argmax(-1)).all()


class Taken(Exception):
    pass


def test_only_small_steps_take_the_fused_path(monkeypatch):
    model, config = make_model("llama-gqa", torch.float32)

    def taken(*args):
        raise Taken

    monkeypatch.setattr(ops, "decode_layers", taken)
    for rows, fused in ((cpu_decode.MAX_ROWS + 1, False), (cpu_decode.MAX_ROWS, True)):
        caches, md, positions = make_step(config, torch.float32, [rows + 8], [rows])
        ids = torch.zeros(rows, dtype=torch.long)
        if fused:
            with pytest.raises(Taken):
                run(model, caches, md, ids, positions, "fused", monkeypatch)
        else:
            run(model, caches, md, ids, positions, "fused", monkeypatch)
    run(model, caches, md, ids, positions, "native", monkeypatch)  # the reference setting


def test_stage_clock_times_every_stage_and_changes_nothing(monkeypatch):
    """decode_layers with cpu_decode.stage_ms set: the same hidden states and caches bit for
    bit, every stage's entry grows (each op in its own loop: the folds time a folded op in its
    loop's stage, test_folds_change_nothing), and a tensor of the wrong kind is refused by
    name."""
    monkeypatch.setenv("VLLM_CPU_DECODE_FOLD", "0")
    model, config = make_model("llama-gqa", torch.bfloat16)
    caches, md, positions = make_step(config, torch.bfloat16, [9, 30, 2], [1, 1, 2])
    ids = torch.randint(0, config.vocab_size, (len(positions),),
                        generator=torch.Generator().manual_seed(2))
    hidden, _, new_caches = run(model, caches, md, ids, positions, "fused", monkeypatch)
    monkeypatch.setattr(cpu_decode, "stage_ms", torch.zeros(len(ops.DECODE_STAGES),
                                                            dtype=torch.float64))
    for step in range(2):
        before = cpu_decode.stage_ms.clone()
        timed, _, timed_caches = run(model, caches, md, ids, positions, "fused", monkeypatch)
        assert torch.equal(timed, hidden)
        for (k, v), (tk, tv) in zip(new_caches, timed_caches):
            assert torch.equal(k, tk) and torch.equal(v, tv)
        grew = cpu_decode.stage_ms > before
        untimed = [n for n, g in zip(ops.DECODE_STAGES, grew)
                   if not g and n not in ops.GREEDY_STAGES]
        assert not untimed, f"stages not timed: {untimed}"
        assert not grew[[ops.DECODE_STAGES.index(n) for n in ops.GREEDY_STAGES]].any()
    monkeypatch.setattr(cpu_decode, "stage_ms", torch.zeros(len(ops.DECODE_STAGES)))
    with pytest.raises(RuntimeError, match="stage_ms must be a contiguous CPU float64"):
        run(model, caches, md, ids, positions, "fused", monkeypatch)


def runs_under(settings, model, caches, md, ids, positions, monkeypatch):
    """The fused path's (hidden, logits, caches) under each of `settings` ({variable: value}),
    asserted bit-identical to the first's; returns the first."""
    results = []
    for setting in settings:
        for name, value in setting.items():
            monkeypatch.setenv(name, value)
        results.append(run(model, caches, md, ids, positions, "fused", monkeypatch))
    (h0, l0, c0) = results[0]
    for setting, (h, l, c) in zip(settings[1:], results[1:]):
        assert torch.equal(h, h0) and torch.equal(l, l0), setting
        for (k0, v0), (k, v) in zip(c0, c):
            assert torch.equal(k, k0) and torch.equal(v, v0), setting
    return results[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_op_split_changes_nothing(dtype, monkeypatch):
    """decode_layers' norms, silu_and_mul and rotary split over the threads
    (VLLM_CPU_DECODE_SPLIT_ELEMS, 1: every row its own chunk) give the same hidden states and
    caches bit for bit as on one thread (0); a value that is not a count is refused by name."""
    model, config = make_model("llama-gqa", dtype)
    caches, md, positions = make_step(config, dtype, [40, 3, 17, 64, 1, 22, 9, 31], [1] * 8)
    ids = torch.randint(0, config.vocab_size, (len(positions),),
                        generator=torch.Generator().manual_seed(3))
    runs_under([{"VLLM_CPU_DECODE_SPLIT_ELEMS": e} for e in ("0", "1")], model, caches, md, ids,
               positions, monkeypatch)
    monkeypatch.setenv("VLLM_CPU_DECODE_SPLIT_ELEMS", "lots")
    with pytest.raises(RuntimeError, match="VLLM_CPU_DECODE_SPLIT_ELEMS must be a count"):
        run(model, caches, md, ids, positions, "fused", monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("context_lens,q_lens", [
    ([7], [1]),  # one draft step
    ([40, 3, 17, 64, 1, 22, 9, 31], [1] * 8),  # a batch of 8 decodes
    ([20, 35, 5, 9], [5] * 4),  # 20 rows (fp32: torch's GEMM, so no team)
])
@pytest.mark.parametrize("threads", [2, 3, "all"])
def test_team_changes_nothing(dtype, context_lens, q_lens, threads, monkeypatch):
    """decode_layers' step in one parallel region with its loops handed to spinning threads
    (VLLM_CPU_DECODE_TEAM=1, team.h) gives the same hidden states, logits and caches bit for bit
    as a region per loop (0): the same chunks of every loop, at 2 and 3 threads (3: chunks that
    do not divide evenly) and at one a core (16 on the GPU machine's host); a step that fails
    inside the region raises its error by name and leaves the next step whole; a bad setting is
    refused by name."""
    model, config = make_model("llama-gqa", dtype)
    caches, md, positions = make_step(config, dtype, context_lens, q_lens)
    ids = torch.randint(0, config.vocab_size, (len(positions),),
                        generator=torch.Generator().manual_seed(4))
    monkeypatch.setenv("VLLM_CPU_DECODE_SPLIT_ELEMS", "1")  # every small op split as well
    saved = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() if threads == "all" else threads)
    try:
        h0 = runs_under([{"VLLM_CPU_DECODE_TEAM": t} for t in ("0", "1")], model, caches, md,
                        ids, positions, monkeypatch)[0]
        # an error raised inside the region (the second layer's qkv weight of a wrong shape)
        weights = cpu_decode._layer_weights(model.model)
        bad = list(weights)
        bad[7 + 1] = bad[7 + 1][:-1]
        attn = model.model.layers[0].self_attn
        args = (positions, bad, model.model.norm.weight.detach(), attn.rotary_emb.cos_sin_cache,
                [k.clone() for k, _ in caches], [v.clone() for _, v in caches], md.slot_mapping,
                md.block_tables, md.context_lens, md.query_start_loc, md.max_context_len,
                attn.num_heads, attn.num_kv_heads, attn.head_dim, 1e-5, attn.attn.scale, True, [])
        hidden = torch.randn(len(positions), config.hidden_size).to(dtype)
        with pytest.raises(RuntimeError, match="layer 1: qkv weight must be"):
            ops.decode_layers(hidden, *args)
        assert torch.equal(run(model, caches, md, ids, positions, "fused", monkeypatch)[0], h0)
    finally:
        torch.set_num_threads(saved)
    monkeypatch.setenv("VLLM_CPU_DECODE_TEAM", "yes")
    with pytest.raises(RuntimeError, match="VLLM_CPU_DECODE_TEAM must be 0 or 1"):
        run(model, caches, md, ids, positions, "fused", monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", ["llama-gqa", "qwen2-bias"])
@pytest.mark.parametrize("context_lens,q_lens", [
    ([7], [1]),  # one draft step
    ([250], [1]),  # one draft step of a long context: its attention tasks split into parts
    ([200, 150], [1, 1]),  # 2 rows, the fewest the packed tiles take; split tasks
    ([40, 3, 17, 64, 1, 22, 9, 31], [1] * 8),  # a batch of 8 decodes
    ([20, 35, 5, 9], [5] * 4),  # 20 rows (AMX: two row groups)
    ([30] * 8 + [9] * 2, [4] * 10),  # 40 rows (AMX: a panel at a time)
    ([60, 40], [40, 1]),  # 40 tokens of one sequence: more than one attention task (llama-gqa)
])
@pytest.mark.parametrize("amx", ["0", "auto"])
# 16: the GPU machine's host count (here more threads than cores: other chunks and tasks a panel)
@pytest.mark.parametrize("threads", [2, 3, 16])
def test_folds_change_nothing(dtype, shape, context_lens, q_lens, amx, threads, monkeypatch):
    """The folds (VLLM_CPU_DECODE_FOLD=1) give the same hidden states, logits and caches bit for
    bit as each op in its own loop (0): rotary and the cache write inside the attention's tasks
    (each rotates its own query heads, the part that reads a new key writes it, a split task's
    merge on the thread that finishes its last part; the ops in turn where a sequence's tokens
    are more than one task), and, on the packed bf16 tiles (AVX512_BF16; AMX where the CPU has
    it), the norms and silu_and_mul inside the linears' loops (the rows normalised once by the
    threads that claim them and shared, VLLM_CPU_FOLD_SHARE=1, or by each thread for itself,
    the first task's thread writing the residual stream, 0; each gate/up task finishes its own
    columns of silu(gate) * up), the attention as the qkv loop's tail or a loop of its own
    (VLLM_CPU_ATTENTION_TAIL; that the tail runs is test_step_trace's), the shared norms after
    the first as the o and down loops' tails (VLLM_CPU_NORM_TAIL) or in the linears' loops;
    with and without the team, at 2, 3 and 16 threads. That the
    folds ran is read off the stage clock (rotary + cache, and silu where the linears fold, stay
    at zero); a bad setting is refused by name."""
    if amx == "auto" and dtype == torch.float32:
        pytest.skip("AMX tiles are bf16's")
    model, config = make_model(shape, dtype, intermediate_size=256)
    caches, md, positions = make_step(config, dtype, context_lens, q_lens)
    ids = torch.randint(0, config.vocab_size, (len(positions),),
                        generator=torch.Generator().manual_seed(5))
    monkeypatch.setenv("VLLM_CPU_AMX", amx)
    monkeypatch.setenv("VLLM_CPU_DECODE_SPLIT_ELEMS", "1")  # the unfolded small ops split too
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runs_under([{"VLLM_CPU_DECODE_FOLD": f, "VLLM_CPU_DECODE_TEAM": t,
                     "VLLM_CPU_FOLD_SHARE": s, "VLLM_CPU_ATTENTION_TAIL": a,
                     "VLLM_CPU_NORM_TAIL": n}
                    for f, t, s, a, n in (("0", "1", "1", "1", "0"), ("1", "1", "1", "1", "0"),
                                          ("1", "1", "1", "1", "1"), ("1", "1", "1", "0", "1"),
                                          ("1", "1", "1", "0", "0"), ("1", "0", "1", "1", "1"),
                                          ("1", "1", "0", "1", "1"), ("1", "0", "0", "1", "0"))],
                   model, caches, md, ids, positions, monkeypatch)
        group = config.num_attention_heads // config.num_key_value_heads
        attention_folds = max(q_lens) <= 64 // group
        linears_fold = (dtype == torch.bfloat16 and has_avx512_bf16() and len(positions) >= 2
                        and len(positions) <= cpu_decode.MAX_ROWS)
        rotary, silu = (ops.DECODE_STAGES.index(n) for n in ("rotary_cache", "silu"))
        for fold in ("1", "0"):
            monkeypatch.setenv("VLLM_CPU_DECODE_FOLD", fold)
            monkeypatch.setattr(cpu_decode, "stage_ms", torch.zeros(len(ops.DECODE_STAGES),
                                                                    dtype=torch.float64))
            run(model, caches, md, ids, positions, "fused", monkeypatch)
            ms = cpu_decode.stage_ms
            assert (ms[rotary] == 0) == (fold == "1" and attention_folds), (fold, ms)
            assert (ms[silu] == 0) == (fold == "1" and linears_fold), (fold, ms)
    finally:
        torch.set_num_threads(saved)
    monkeypatch.setattr(cpu_decode, "stage_ms", None)
    # each switch refused by name where it is read: the share where a norm folds, the tail
    # where the attention folds, the folds always
    for name, read in (("VLLM_CPU_FOLD_SHARE", linears_fold),
                       ("VLLM_CPU_NORM_TAIL", linears_fold),
                       ("VLLM_CPU_ATTENTION_TAIL", attention_folds),
                       ("VLLM_CPU_DECODE_FOLD", True)):
        if not read:
            continue
        monkeypatch.setenv("VLLM_CPU_DECODE_FOLD", "1")
        monkeypatch.setenv(name, "yes")
        with pytest.raises(RuntimeError, match=f"{name} must be 0 or 1"):
            run(model, caches, md, ids, positions, "fused", monkeypatch)
        monkeypatch.setenv(name, "1")


@pytest.mark.parametrize("fold", ["0", "1"])
def test_bad_positions_and_slots_are_named_and_write_nothing(fold, monkeypatch):
    """A position outside the rotary table or a slot past the cache stops decode_layers with
    the op's error, folded into the attention or not, before any cache is written."""
    monkeypatch.setenv("VLLM_CPU_DECODE_FOLD", fold)
    model, config = make_model("llama-gqa", torch.float32)
    caches, md, positions = make_step(config, torch.float32, [40, 3], [1, 1])
    weights = cpu_decode._layer_weights(model.model)
    attn = model.model.layers[0].self_attn
    table = attn.rotary_emb.cos_sin_cache
    for bad_pos, slots, message in (
            (table.shape[0], md.slot_mapping, "is outside cos_sin_cache"),
            (None, torch.tensor([0, caches[0][0].shape[0] * BLOCK]), "is past the cache")):
        pos = positions.clone()
        if bad_pos is not None:
            pos[1] = bad_pos
        kc, vc = [k.clone() for k, _ in caches], [v.clone() for _, v in caches]
        with pytest.raises(RuntimeError, match=message):
            ops.decode_layers(torch.randn(2, config.hidden_size), pos, weights,
                              model.model.norm.weight.detach(), table, kc, vc, slots,
                              md.block_tables, md.context_lens, md.query_start_loc,
                              md.max_context_len, attn.num_heads, attn.num_kv_heads,
                              attn.head_dim, 1e-5, attn.attn.scale, True, [])
        for (k, v), k2, v2 in zip(caches, kc, vc):
            assert torch.equal(k, k2) and torch.equal(v, v2)


@pytest.mark.parametrize("shape", ["llama-gqa", "qwen2-bias"])  # an LM head; tied embeddings
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 8, 64])
def test_compute_argmax_is_the_argmax_of_the_logits(shape, dtype, rows):
    """A greedy draft's tokens (compute_argmax: linear_argmax, no fp32 logits, 1 to 64 rows)
    are argmax_rows of compute_logits', for the same hidden rows."""
    from vllm.model_executor.sampler import argmax_rows
    model, config = make_model(shape, dtype)
    hidden = torch.randn(rows, config.hidden_size, generator=torch.Generator().manual_seed(rows))
    hidden = hidden.to(dtype)
    with torch.inference_mode():
        assert torch.equal(model.compute_argmax(hidden),
                           argmax_rows(model.compute_logits(hidden)))


def step_metadata(tables: torch.Tensor, positions: torch.Tensor,
                  q_lens: Optional[list[int]] = None) -> AttentionMetadata:
    """The metadata of a step feeding q_lens[r] tokens (default one) of sequence r at positions
    (flat, each sequence's consecutive), with these tables."""
    q_lens = q_lens or [1] * tables.shape[0]
    seq_of = [r for r, q in enumerate(q_lens) for _ in range(q)]
    slots = torch.stack([tables[r, int(p) // BLOCK].long() * BLOCK + int(p) % BLOCK
                         for r, p in zip(seq_of, positions)])
    starts = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32)
    context_lens = (positions[starts[1:].long() - 1] + 1).to(torch.int32)
    return AttentionMetadata(slots, tables, context_lens, starts, int(context_lens.max()),
                             list(q_lens), False)


@pytest.mark.parametrize("shape", ["llama-gqa", "qwen2-bias"])  # an LM head; tied embeddings
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("context_lens,q_lens", [
    ([7], [1]), ([9, 30, 2], [1, 1, 1]), ([40, 3, 17, 64, 1, 22, 9, 31], [1] * 8),
    ([30] * 32 + [9] * 32, [1] * 64),
    # a first step that catches sequences up on several tokens (a draft's after a full
    # acceptance: its last draft and the bonus token), in rows of 2, 1 + 2 + 4 and 12
    ([7], [2]), ([9, 30, 4], [2, 1, 4]), ([40, 3, 17, 64, 2, 22, 9, 31], [2, 1, 2, 1, 2, 1, 2, 1]),
])
@pytest.mark.parametrize("steps", [1, 3])
def test_greedy_step_is_the_models_forward_and_argmax(shape, dtype, context_lens, q_lens, steps,
                                                      monkeypatch):
    """GreedyStep (greedy_steps: each step the embedding, decode_layers and linear_argmax, its
    tokens the next step's input) gives the tokens and writes the KV that as many steps of the
    model's forward and compute_argmax do, bit for bit, at 1 to 64 rows (a block boundary
    crossed between steps: 30 + 3 > 32), its first step feeding one token a sequence or several
    (the argmax of each sequence's last); where the path does not apply (the native path) it
    returns None and writes nothing."""
    model, config = make_model(shape, dtype)
    # blocks for the last step's positions; the first step feeds each sequence's tokens
    # c - q .. c - 1
    caches, md, _ = make_step(config, dtype, [c + steps for c in context_lens], q_lens)
    tables = md.block_tables
    first = torch.tensor([p for c, q in zip(context_lens, q_lens) for p in range(c - q, c)])
    last = torch.tensor([c - 1 for c in context_lens])
    ids = torch.randint(0, config.vocab_size, (len(first),),
                        generator=torch.Generator().manual_seed(3))
    starts = None
    if len(first) != len(context_lens):
        starts = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32)
    monkeypatch.setenv("VLLM_CPU_DECODE_PATH", "fused")
    ref_caches = [(k.clone(), v.clone()) for k, v in caches]
    with torch.inference_mode():
        with set_forward_context(step_metadata(tables, first, q_lens), ref_caches):
            hidden = model(ids, first)
            step_ids = model.compute_argmax(hidden[torch.cumsum(torch.tensor(q_lens), 0) - 1])
        ref_tokens = [step_ids]
        for s in range(1, steps):
            with set_forward_context(step_metadata(tables, last + s), ref_caches):
                step_ids = model.compute_argmax(model(step_ids, last + s))
            ref_tokens.append(step_ids)
        mine = [(k.clone(), v.clone()) for k, v in caches]
        tokens = cpu_decode.GreedyStep.build(model, mine)(ids, first, tables, steps, starts)
        # all steps in one team region (the default) or each call its own regions
        monkeypatch.setenv("VLLM_CPU_DECODE_TEAM", "0")
        apart = [(k.clone(), v.clone()) for k, v in caches]
        tokens_apart = cpu_decode.GreedyStep.build(model, apart)(ids, first, tables, steps,
                                                                 starts)
        monkeypatch.delenv("VLLM_CPU_DECODE_TEAM")
    assert torch.equal(tokens, torch.stack(ref_tokens))
    assert torch.equal(tokens_apart, tokens)
    for (k, v), (rk, rv), (ka, va) in zip(mine, ref_caches, apart):
        assert torch.equal(k, rk) and torch.equal(v, rv)
        assert torch.equal(ka, rk) and torch.equal(va, rv)
    monkeypatch.setenv("VLLM_CPU_DECODE_PATH", "native")
    untouched = [(k.clone(), v.clone()) for k, v in caches]
    with torch.inference_mode():
        step = cpu_decode.GreedyStep.build(model, untouched)
        assert step(ids, first, tables, steps, starts) is None
    assert all(torch.equal(k, k0) and torch.equal(v, v0)
               for (k, v), (k0, v0) in zip(untouched, caches))


def test_greedy_steps_time_their_inputs_and_lm_head(monkeypatch):
    """greedy_steps with cpu_decode.stage_ms set, and given step_ms, gives the same tokens and
    KV, adds each step's input rows and LM head (linear_argmax) to their own stages beside
    decode_layers', and writes each step's ms to step_ms; a step_ms of the wrong size is
    refused by name."""
    model, config = make_model("llama-gqa", torch.bfloat16)
    context_lens, steps = [9, 30, 4], 3
    caches, md, _ = make_step(config, torch.bfloat16, [c + steps for c in context_lens],
                              [1] * len(context_lens))
    first = torch.tensor([c - 1 for c in context_lens])
    ids = torch.randint(0, config.vocab_size, (len(first),),
                        generator=torch.Generator().manual_seed(6))
    monkeypatch.setenv("VLLM_CPU_DECODE_PATH", "fused")
    plain_caches = [(k.clone(), v.clone()) for k, v in caches]
    timed_caches = [(k.clone(), v.clone()) for k, v in caches]
    with torch.inference_mode():
        plain = cpu_decode.GreedyStep.build(model, plain_caches)(ids, first, md.block_tables,
                                                                 steps, None)
        monkeypatch.setattr(cpu_decode, "stage_ms", torch.zeros(len(ops.DECODE_STAGES),
                                                                dtype=torch.float64))
        step_ms = torch.full((steps,), -1.0, dtype=torch.float64)
        timed = cpu_decode.GreedyStep.build(model, timed_caches)(ids, first, md.block_tables,
                                                                 steps, None, step_ms)
        with pytest.raises(RuntimeError, match="step_ms must be a contiguous CPU float64"):
            cpu_decode.GreedyStep.build(model, [(k.clone(), v.clone()) for k, v in caches])(
                ids, first, md.block_tables, steps, None, torch.zeros(steps + 1,
                                                                      dtype=torch.float64))
    assert torch.equal(timed, plain)
    for (k, v), (tk, tv) in zip(plain_caches, timed_caches):
        assert torch.equal(k, tk) and torch.equal(v, tv)
    ms = dict(zip(ops.DECODE_STAGES, cpu_decode.stage_ms.tolist()))
    assert all(ms[n] > 0 for n in ops.GREEDY_STAGES + ("qkv", "attention")), ms
    assert (step_ms > 0).all(), step_ms


def test_greedy_steps_reject_tables_and_tokens_out_of_range():
    """Steps reaching past a sequence's block table, a token outside the embedding, a first
    step's query starts that skip a sequence or do not cover the tokens, or a sequence's
    positions not consecutive are named, and nothing is written."""
    model, config = make_model("llama-gqa", torch.float32)
    caches, md, _ = make_step(config, torch.float32, [20, 5], [1, 1])
    step = cpu_decode.GreedyStep.build(model, caches)
    before = [(k.clone(), v.clone()) for k, v in caches]
    width = md.block_tables.shape[1] * BLOCK
    cases = [(torch.tensor([1, 2]), torch.tensor([width - 2, 3]), 3, "reach past the block"),
             (torch.tensor([1, config.vocab_size]), torch.tensor([19, 4]), 1,
              "outside the embedding")]
    cases = [(*case, None) for case in cases]
    three = torch.tensor([1, 2, 3])
    for starts, positions, message in (([0, 3, 3], [17, 18, 19], "feeds no token"),
                                       ([0, 2, 4], [18, 19, 4], "from 0 to the 3 tokens"),
                                       ([0, 2, 3], [17, 19, 4], "must be consecutive"),
                                       ([0, 2, 3], [width - 2, width - 1, 4], "reach past")):
        cases.append((three, torch.tensor(positions), 2, message,
                      torch.tensor(starts, dtype=torch.int32)))
    with torch.inference_mode():
        for ids, positions, steps, message, starts in cases:
            with pytest.raises(RuntimeError, match=message):
                step(ids, positions, md.block_tables, steps, starts)
    assert all(torch.equal(k, k0) and torch.equal(v, v0)
               for (k, v), (k0, v0) in zip(caches, before))


def test_greedy_step_follows_replaced_weights():
    """GreedyStep keeps the op's weight arguments between calls; new weights (new storage: a
    reload, new parameters) of the LM head or of a layer are what its next call runs, as the
    model's forward does."""
    model, config = make_model("llama-gqa", torch.float32)
    caches, md, _ = make_step(config, torch.float32, [9, 30], [1, 1])
    positions, ids = torch.tensor([8, 29]), torch.tensor([3, 7])
    step = cpu_decode.GreedyStep.build(model, [(k.clone(), v.clone()) for k, v in caches])
    qkv = model.model.layers[0].self_attn.qkv_proj
    torch.manual_seed(1)
    with torch.inference_mode():
        tokens = [step(ids, positions, md.block_tables)]
        for module, scale in ((model.lm_head, 1.0), (qkv, 0.2)):
            module.weight = torch.nn.Parameter(torch.randn_like(module.weight) * scale)
            tokens.append(step(ids, positions, md.block_tables))
            with set_forward_context(step_metadata(md.block_tables, positions),
                                     [(k.clone(), v.clone()) for k, v in caches]):
                assert torch.equal(tokens[-1][0], model.compute_argmax(model(ids, positions)))
    assert not torch.equal(tokens[1], tokens[0]) and not torch.equal(tokens[2], tokens[1])


def test_greedy_step_is_built_for_cpu_llama_models_only():
    """No GreedyStep for a model that is not Llama-family or whose weights are not on the CPU."""
    model, _ = make_model("llama-gqa", torch.float32)
    assert cpu_decode.GreedyStep.build(model, []) is not None
    assert cpu_decode.GreedyStep.build(torch.nn.Linear(2, 2), []) is None
    assert cpu_decode.GreedyStep.build(model.to("meta"), []) is None


def test_opcheck():
    model, config = make_model("qwen2-bias", torch.float32)
    caches, md, positions = make_step(config, torch.float32, [20, 5], [2, 1])
    weights = cpu_decode._layer_weights(model.model)
    attn = model.model.layers[0].self_attn
    hidden = torch.randn(3, config.hidden_size)
    torch.library.opcheck(torch.ops._C.decode_layers.default, (
        hidden, positions, weights, model.model.norm.weight.detach(),
        attn.rotary_emb.cos_sin_cache, [k for k, _ in caches], [v for _, v in caches],
        md.slot_mapping, md.block_tables, md.context_lens, md.query_start_loc,
        md.max_context_len, attn.num_heads, attn.num_kv_heads, attn.head_dim, 1e-5,
        attn.attn.scale, True, []))
    x, w = torch.randn(3, 64), torch.randn(40, 64)
    torch.library.opcheck(torch.ops._C.linear_small.default,
                          (torch.empty(3, 40), x, w, torch.randn(40)))
    torch.library.opcheck(torch.ops._C.linear_argmax.default,
                          (torch.empty(3, dtype=torch.long), x, w, w.new_empty(0)))
    embed = model.model.embed_tokens.weight.detach()
    torch.library.opcheck(torch.ops._C.greedy_steps.default, (
        torch.empty(2, 2, dtype=torch.long), torch.tensor([3, 4]), torch.tensor([19, 4]), embed,
        weights, model.model.norm.weight.detach(), attn.rotary_emb.cos_sin_cache,
        [k for k, _ in caches], [v for _, v in caches], md.block_tables, attn.num_heads,
        attn.num_kv_heads, attn.head_dim, 1e-5, attn.attn.scale, True, [], embed,
        embed.new_empty(0)))



@pytest.mark.skipif(not has_avx512_bf16(), reason="weights pack only on AVX512_BF16")
def test_weights_pack_at_the_first_step_that_uses_them(monkeypatch):
    """Steps of fewer than PACKED_MIN_ROWS rows never make the packed copies (a draft at batch 1
    keeps its memory); the first step of that many makes them for every layer's four linears and
    the logits, and then computes what the row-major weights do."""
    model, config = make_model("qwen2-bias", torch.bfloat16)
    rows = cpu_decode.PACKED_MIN_ROWS
    for n, packs in ((rows - 1, False), (rows, True)):
        caches, md, positions = make_step(config, torch.bfloat16, [20] * n, [1] * n)
        ids = torch.arange(n) % config.vocab_size
        hidden, logits, _ = run(model, caches, md, ids, positions, "fused", monkeypatch)
        packed = getattr(model.model, "_decode_packed", None)
        head = getattr(model.model.embed_tokens, "_packed_weight", None)
        if not packs:
            assert packed is None and head is None
            continue
        assert len(packed) == 4 * config.num_hidden_layers and all(p.numel() > 0 for p in packed)
        assert head is not None and head[1].numel() > 0
        ref_hidden, ref_logits, _ = run(model, caches, md, ids, positions, "native", monkeypatch)
        assert_close("decode_layers packed", hidden.float(), ref_hidden.float(), torch.bfloat16,
                     tol_scale=2)
        assert_close("decode_layers packed logits", logits, ref_logits, torch.bfloat16,
                     tol_scale=2)
