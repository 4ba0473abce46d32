"""The tensor-parallel group of this process: its rank, its size, and the collectives the sharded
layers and the executors use. One process per rank; torch.distributed with NCCL between GPUs and
gloo between CPU processes, plus a gloo group for the driver's control messages (the step's
inputs) that may wait as long as the engine stays idle.

Layers take the group current when they are built (`building(size)` around model
construction): a tensor-parallel target gets the process's group, while a model of size 1 (the
draft, on the driver) gets the trivial group and never communicates."""
import contextlib
import datetime
import socket
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist


@dataclass
class TPGroup:
    rank: int = 0
    size: int = 1
    device_group: Any = None  # collectives on the model's tensors (NCCL or gloo)
    cpu_group: Any = None  # pickled control messages (gloo)

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place."""
        if self.size > 1:
            dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's x concatenated along dim (rank order)."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.device_group)
        return torch.cat(parts, dim=dim)

    def min_int(self, value: int) -> int:
        """The smallest value over ranks (each sizes its KV cache; all must agree)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def broadcast_object(self, obj: Any = None) -> Any:
        """The driver's obj, on every rank."""
        holder = [obj]
        dist.broadcast_object_list(holder, src=0, group=self.cpu_group)
        return holder[0]


_SINGLE = TPGroup()
_world: TPGroup = _SINGLE  # this process's group once init_distributed ran
_building: TPGroup = _SINGLE  # the group layers take while a model is constructed


def get_open_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_distributed(rank: int, world_size: int, init_method: str, backend: str) -> TPGroup:
    """Joins the group (blocks until every rank joined). backend: nccl or gloo."""
    global _world
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process")
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    # an idle engine sends nothing: the control group waits for the next step indefinitely
    cpu_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=365))
    device_group = dist.group.WORLD
    _world = TPGroup(rank, world_size, device_group, cpu_group)
    return _world


def destroy_distributed() -> None:
    global _world
    _world = _SINGLE
    if dist.is_initialized():
        dist.destroy_process_group()


def get_world() -> TPGroup:
    return _world


def get_tp_group() -> TPGroup:
    """The group of the model being built (the trivial group outside `building`)."""
    return _building


@contextlib.contextmanager
def building(tensor_parallel_size: int) -> Iterator[TPGroup]:
    """Layers constructed inside take the process's group if the model is sharded, the trivial
    group if it is not (a draft next to a sharded target)."""
    global _building
    group = _SINGLE if tensor_parallel_size == 1 else _world
    if group.size != tensor_parallel_size:
        raise RuntimeError(f"a model of tensor_parallel_size={tensor_parallel_size} is built in "
                           f"a process group of {group.size} rank(s)")
    previous, _building = _building, group
    try:
        yield group
    finally:
        _building = previous


def shard_range(total: int, rank: int, size: int) -> tuple[int, int]:
    """[start, end) of rank's equal share of total (total divisible by size)."""
    if total % size:
        raise ValueError(f"{total} is not divisible by tensor_parallel_size={size}")
    per = total // size
    return rank * per, (rank + 1) * per


def kv_head_range(num_kv_heads: int, rank: int, size: int) -> tuple[int, int]:
    """The KV heads rank holds: an equal share, or one head replicated over size / num_kv_heads
    ranks when there are fewer KV heads than ranks (GQA)."""
    if num_kv_heads >= size:
        return shard_range(num_kv_heads, rank, size)
    head = rank // (size // num_kv_heads)
    return head, head + 1

