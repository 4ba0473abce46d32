"""The bf16 CPU linear on weights packed at load (pack_linear, linear_packed): the packed layout
holds exactly the weight (zeros past its rows and columns), and the packed tiles' outputs equal
F.linear's in fp32 within bf16 tolerance for every count of input rows left over by the 12-row
tiles, odd weight-row and column counts, a bias, and rows inside wider buffers. Row counts
below the packed tiles' minimum and above their maximum take linear_small's kernels (and must
agree too)."""
import pytest
import torch
import torch.nn.functional as F

from tests.utils import assert_close, check_strided_bf16_linear, cpu_has, has_avx512_bf16
from vllm import _custom_ops as ops

pytestmark = pytest.mark.skipif(not ops.has_kernel("linear_packed", "cpu"),
                                reason="vllm._C without the CPU packed linear")


needs_bf16_dot = pytest.mark.skipif(not has_avx512_bf16(), reason="packs only on AVX512_BF16")


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """[ceil(n / 16), ceil(k / 2) * 32] -> the [n, k] weight with the padding beside it."""
    panels, width = packed.shape
    pairs = width // 32
    return packed.view(panels, pairs, 16, 2).permute(0, 2, 1, 3).reshape(panels * 16, pairs * 2)


@needs_bf16_dot
@pytest.mark.parametrize("n,k", [(16, 2), (37, 810), (48, 33), (1, 1), (1152, 896)])
def test_pack_layout_holds_the_weight(n, k):
    w = torch.randn(n, k, dtype=torch.bfloat16)
    packed = ops.pack_linear(w)
    assert packed.shape == (-(-n // 16), -(-k // 2) * 32)
    full = unpack(packed)
    assert torch.equal(full[:n, :k], w)
    assert (full[n:] == 0).all() and (full[:, k:] == 0).all()


def test_pack_is_empty_where_it_does_not_apply():
    """fp32 weights never pack (their kernels read the row-major weight)."""
    assert ops.pack_linear(torch.randn(32, 64)).numel() == 0


@needs_bf16_dot
# m: below the packed tiles (1: linear_small's GEMV), 2 upward with every count of rows left over
# by 12-row tiles (2-11, 13-23), whole tiles (12, 24, 36, 48, 60), the largest the tiles take (64)
# and one above it (65: torch's GEMM)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                               20, 21, 22, 23, 24, 36, 48, 60, 64, 65])
# n: whole 2-panel tiles (64, 1152), an odd panel count (48: a 1-panel tile at the end), a panel
# tail (37, 1); k: even, odd (810 + 1, 33, 1)
@pytest.mark.parametrize("n,k", [(64, 64), (1152, 896), (48, 33), (37, 811), (1, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_packed_matches_f_linear(m, n, k, bias):
    torch.manual_seed(m * n + k)
    x, w = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, dtype=torch.bfloat16) if bias else None
    packed = ops.pack_linear(w)
    assert packed.numel() > 0
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    ops.linear_packed(out, x, w, packed, b)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert_close("linear_packed", out.float(), ref, torch.bfloat16)


@needs_bf16_dot
@pytest.mark.parametrize("m", [8, 13, 30])
def test_linear_packed_strided_rows(m):
    """Input and out rows inside wider buffers (as decode_layers passes them); nothing written
    outside out's columns."""
    check_strided_bf16_linear("linear_packed strided", lambda out, x, w, b: ops.linear_packed(
        out, x, w, ops.pack_linear(w), b), m, 70, 100)


def test_linear_packed_without_a_copy_is_linear_small():
    """An empty packed tensor (a CPU or dtype without one) runs linear_small's kernels."""
    x, w = torch.randn(20, 64), torch.randn(40, 64)
    out = torch.empty(20, 40)
    ops.linear_packed(out, x, w, w.new_empty(0), None)
    assert_close("linear_packed unpacked", out, F.linear(x, w), torch.float32)


@needs_bf16_dot
def test_linear_packed_rejects_another_weights_copy():
    w = torch.randn(40, 64, dtype=torch.bfloat16)
    other = ops.pack_linear(torch.randn(40, 66, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="packed weight must be pack_linear's"):
        ops.linear_packed(torch.empty(8, 40, dtype=torch.bfloat16),
                          torch.randn(8, 64, dtype=torch.bfloat16), w, other, None)


@needs_bf16_dot
def test_opcheck():
    w = torch.randn(40, 64, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops._C.linear_packed.default,
                          (torch.empty(9, 40, dtype=torch.bfloat16),
                           torch.randn(9, 64, dtype=torch.bfloat16), w, ops.pack_linear(w),
                           torch.randn(40, dtype=torch.bfloat16)))


@needs_bf16_dot
@pytest.mark.parametrize("amx", ["0", "auto", "all"])
@pytest.mark.parametrize("m", [1, 3, 8, 11, 16, 17, 20, 32, 33, 40, 49, 64])
# n: whole groups of 4 panels (2048), 1-3 panels left over after them (48, 80 + a 4-row tail:
# 84), fewer rows than a panel (12); k: multiples of the tiles' 32 columns, one that is not (48)
@pytest.mark.parametrize("n,k", [(2048, 576), (48, 64), (84, 96), (12, 64), (64, 48)])
def test_linear_packed_amx_setting(amx, m, n, k, monkeypatch):
    """Packed weights through AMX tiles where the CPU has them (VLLM_CPU_AMX: 0 never, auto
    8-64 rows, all 1-64: 17-32 rows as two row groups against two panels a pass, 33-64 as 3-4
    groups against one; K a multiple of 32), the packed AVX512 tiles or linear_small's kernels
    elsewhere: the reference's sums, strided input and out rows and a bias included."""
    monkeypatch.setenv("VLLM_CPU_AMX", amx)
    check_strided_bf16_linear("linear_packed amx", lambda out, x, w, b: ops.linear_packed(
        out, x, w, ops.pack_linear(w), b), m, n, k)


@pytest.mark.skipif(not cpu_has("amx_bf16"), reason="read by the packed AMX tiles")
@pytest.mark.parametrize("name,value,message", [
    ("VLLM_CPU_AMX_PREFETCH", "yes", "must be 0, 1 or l1"),
    ("VLLM_CPU_AMX_KEEP_TILES", "yes", "must be 0 or 1"),
    ("VLLM_CPU_AMX_INPUT_AHEAD", "65", "must be a number of k-steps from 0 to 64"),
    ("VLLM_CPU_AMX_INPUT_AHEAD", "-1", "must be a number of k-steps from 0 to 64"),
    ("VLLM_CPU_AMX_INPUT_AHEAD", "4x", "must be a number of k-steps from 0 to 64"),
])
def test_amx_settings_are_checked(name, value, message, monkeypatch):
    """The packed AMX tiles' settings, read at each call: VLLM_CPU_AMX_PREFETCH takes 0, 1 or
    l1, VLLM_CPU_AMX_KEEP_TILES 0 or 1, VLLM_CPU_AMX_INPUT_AHEAD 0 to 64; anything else is an
    error naming the setting."""
    monkeypatch.setenv(name, value)
    check_packed_setting_error(name, message)


def check_packed_setting_error(name: str, message: str) -> None:
    """An 8-row linear on a packed copy raises `name message`."""
    w = torch.randn(64, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=f"{name} {message}"):
        ops.linear_packed(torch.empty(8, 64, dtype=torch.bfloat16),
                          torch.randn(8, 64, dtype=torch.bfloat16), w, ops.pack_linear(w), None)


@needs_bf16_dot
@pytest.mark.parametrize("value", ["0", "4097", "-1", "8k", "lots"])
def test_packed_grain_is_checked(value, monkeypatch):
    """VLLM_CPU_PACKED_GRAIN_KB (read by every packed linear's loop) takes a number of KB from 1
    to 4096; anything else is an error naming the setting."""
    monkeypatch.setenv("VLLM_CPU_PACKED_GRAIN_KB", value)
    check_packed_setting_error("VLLM_CPU_PACKED_GRAIN_KB", "must be a number of KB from 1 to 4096")


@pytest.mark.skipif(not cpu_has("amx_bf16"), reason="the tiles are kept on AMX only")
@pytest.mark.parametrize("threads", [1, 4])
def test_kept_tiles_are_reconfigured_where_the_rows_change(threads, monkeypatch):
    """With VLLM_CPU_AMX_KEEP_TILES=1 (not the default) a thread keeps its tiles configured
    between loops: each loop's rows (8, 24 and 40: one, two and three row groups, each its own
    configuration), the unpacked AMX linear between them (which configures and releases the
    tiles itself) and the same rows again must each give the reference's sums."""
    monkeypatch.setenv("VLLM_CPU_AMX", "auto")
    monkeypatch.setenv("VLLM_CPU_AMX_KEEP_TILES", "1")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        w = torch.randn(256, 128, dtype=torch.bfloat16) / 128**0.5
        packed = ops.pack_linear(w)
        for m, packed_copy in [(8, True), (24, True), (8, False), (40, True), (12, True),
                               (8, True), (16, False), (24, True)]:
            x = torch.randn(m, 128, dtype=torch.bfloat16)
            out = torch.full((m, 256), float("nan"), dtype=torch.bfloat16)
            if packed_copy:
                ops.linear_packed(out, x, w, packed, None)
            else:
                ops.linear_small(out, x, w, None)
            assert_close(f"kept tiles, {m} rows", out.float(), F.linear(x.float(), w.float()),
                         torch.bfloat16)
    finally:
        torch.set_num_threads(saved)


@needs_bf16_dot
@pytest.mark.parametrize("amx", ["0", "auto"])
@pytest.mark.parametrize("setting", ["default", "l2", "0", "grain32", "grain1", "keep",
                                     "ahead0", "ahead64"])
@pytest.mark.parametrize("threads", [1, 3, 16])
@pytest.mark.parametrize("m", [4, 8, 16, 24])
@pytest.mark.parametrize("n,k", [(576, 1536), (84, 96), (2048, 576), (256, 256)])
def test_linear_packed_panels_per_task(amx, setting, threads, m, n, k, monkeypatch):
    """A task takes the most panels (AMX 4, or 2 at 17-32 rows; the packed AVX512 tiles 2) or
    fewer, whichever leaves the busiest thread the fewest (36 panels on 16 threads: 1; on 3: the
    most; 6 panels on 3 threads: 2; 256 x 256, draft-20m's o: 16 panels of 8 KB, on 4 threads
    at a 32 KB grain, on every thread at 8 or 1): the same sums at every thread count (4 rows:
    the AVX512 tiles either way; 24 rows: AMX's two row groups, or the register tiles with AMX
    off). The defaults (the AMX tiles prefetching each thread's next panels into L1 and the
    input rows 4 k-steps ahead, released after each loop, a grain of 8 KB) and each changed
    alone: prefetches into L2 (VLLM_CPU_AMX_PREFETCH=1) or none (0), a grain of 32 or 1 KB
    (VLLM_CPU_PACKED_GRAIN_KB), the tiles kept configured between loops
    (VLLM_CPU_AMX_KEEP_TILES=1), the input rows not prefetched or 64 k-steps ahead (past every
    k-step here: only the pass's start requests them; VLLM_CPU_AMX_INPUT_AHEAD)."""
    monkeypatch.setenv("VLLM_CPU_AMX", amx)
    for name in ("VLLM_CPU_AMX_PREFETCH", "VLLM_CPU_PACKED_GRAIN_KB", "VLLM_CPU_AMX_KEEP_TILES",
                 "VLLM_CPU_AMX_INPUT_AHEAD"):
        monkeypatch.delenv(name, raising=False)
    changed = {"l2": ("VLLM_CPU_AMX_PREFETCH", "1"), "0": ("VLLM_CPU_AMX_PREFETCH", "0"),
               "grain32": ("VLLM_CPU_PACKED_GRAIN_KB", "32"),
               "grain1": ("VLLM_CPU_PACKED_GRAIN_KB", "1"),
               "keep": ("VLLM_CPU_AMX_KEEP_TILES", "1"),
               "ahead0": ("VLLM_CPU_AMX_INPUT_AHEAD", "0"),
               "ahead64": ("VLLM_CPU_AMX_INPUT_AHEAD", "64")}.get(setting)
    if changed is not None:
        monkeypatch.setenv(*changed)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check_strided_bf16_linear("linear_packed tasks", lambda out, x, w, b: ops.linear_packed(
            out, x, w, ops.pack_linear(w), b), m, n, k)
    finally:
        torch.set_num_threads(saved)
