"""BlockManager: the pool of KV cache blocks, with reference counts so that blocks can be shared
(a fork shares, free releases a reference; a block returns to the pool at zero)."""
from collections import deque


class NoFreeBlocksError(RuntimeError):
    pass


class BlockManager:

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, num: int) -> list[int]:
        if num > len(self._free):
            raise NoFreeBlocksError(f"asked for {num} KV blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(num)]
        for b in blocks:
            self._ref_counts[b] = 1
        return blocks

    def grow(self, block_ids: list[int], num_tokens: int) -> bool:
        """Appends blocks to block_ids until they hold num_tokens; False (and no change) when
        the pool is short."""
        need = self.num_blocks_for(num_tokens) - len(block_ids)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        block_ids.extend(self.allocate(need))
        return True

    def fork(self, block_ids: list[int]) -> list[int]:
        """Shares block_ids with a new owner (one more reference each)."""
        for b in block_ids:
            if self._ref_counts[b] <= 0:
                raise ValueError(f"cannot fork free block {b}")
            self._ref_counts[b] += 1
        return list(block_ids)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def free(self, block_ids: list[int]) -> None:
        for b in block_ids:
            if self._ref_counts[b] <= 0:
                raise ValueError(f"block {b} freed more often than allocated")
            self._ref_counts[b] -= 1
            if self._ref_counts[b] == 0:
                # reused first: the blocks ever written (host pages held) stay at peak usage
                self._free.appendleft(b)
