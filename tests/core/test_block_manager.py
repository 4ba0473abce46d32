"""BlockManager: reference counts, sharing, and the pool."""
import pytest

from vllm.core.block_manager import BlockManager, NoFreeBlocksError


def test_allocate_fork_free_reference_counts():
    bm = BlockManager(num_blocks=4, block_size=16)
    a = bm.allocate(2)
    assert bm.num_free_blocks == 2 and all(bm.ref_count(b) == 1 for b in a)
    shared = bm.fork(a)
    assert all(bm.ref_count(b) == 2 for b in a)
    bm.free(a)
    assert bm.num_free_blocks == 2  # still held by the fork
    bm.free(shared)
    assert bm.num_free_blocks == 4 and bm.usage == 0.0
    with pytest.raises(ValueError, match="freed more often"):
        bm.free(shared)


def test_grow_is_all_or_nothing():
    bm = BlockManager(num_blocks=3, block_size=16)
    blocks: list[int] = []
    assert bm.grow(blocks, 17) and len(blocks) == 2
    assert bm.grow(blocks, 32) and len(blocks) == 2  # already enough
    assert not bm.grow(blocks, 64) and len(blocks) == 2  # needs 2 more, 1 free: unchanged
    assert bm.num_free_blocks == 1
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(2)


def test_freed_blocks_are_reused_first():
    """The blocks ever handed out stay the peak in use (on the CPU, the host pages the KV cache
    holds): a freed block is the next one allocated."""
    bm = BlockManager(100, 16)
    a = bm.allocate(10)
    bm.free(a)
    b = bm.allocate(10)
    assert sorted(b) == sorted(a)
    c = bm.allocate(3)
    bm.free(c[1:2])
    assert bm.allocate(1) == c[1:2]
