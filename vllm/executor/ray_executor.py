"""Tensor parallelism on a Ray cluster (one host or several): a placement group reserves one
bundle per rank (a GPU each on the GPU, a CPU each on the CPU); ranks 1..size-1 are Ray actors in
bundles 1..size-1 and the driver, in this process, is rank 0 (bundle 0 keeps its share reserved).
The ranks meet the driver at its node's address. Connects to the cluster named by RAY_ADDRESS, to
one already initialized in this process, or else starts (and at shutdown stops) a local one."""
import os
from typing import Any

import torch

from vllm.config import VllmConfig
from vllm.distributed.parallel_state import get_open_port
from vllm.executor.distributed_executor import DistributedExecutor, run_rank
from vllm.logger import init_logger

logger = init_logger(__name__)

PLACEMENT_TIMEOUT_S = 60.0


class RankActor:
    """A rank beyond the driver, as a Ray actor."""

    def node_and_gpus(self) -> tuple[str, list]:
        import ray
        return ray.get_runtime_context().get_node_id(), [int(i) for i in ray.get_gpu_ids()]

    def run(self, config: VllmConfig, rank: int, init_method: str, backend: str) -> None:
        # Ray shows the actor only its own GPU
        run_rank(config, rank, init_method, backend, 0)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ValueError("distributed_executor_backend='ray' needs Ray: pip install ray") from e
    return ray


class RayExecutor(DistributedExecutor):

    def _start_ranks(self) -> str:
        ray = _import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False)
        on_gpu = self.config.device.type == "cuda"
        bundle = {"GPU": 1, "CPU": 1} if on_gpu else {"CPU": 1}
        self.pg = placement_group([bundle] * self.size, strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise ValueError(f"tensor_parallel_size={self.size} needs {self.size} x {bundle} on "
                             f"the Ray cluster; it has {ray.cluster_resources()}")
        env = {k: v for k, v in os.environ.items()
               if k.startswith("VLLM_") or k in ("PYTHONPATH", "NCCL_NVLS_ENABLE")}
        actor_cls = ray.remote(RankActor)
        self.actors = [actor_cls.options(
            num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
            runtime_env={"env_vars": env},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=i)).remote()
            for i in range(1, self.size)]
        placed = ray.get([a.node_and_gpus.remote() for a in self.actors])
        if on_gpu:
            self._pick_driver_gpu(ray.get_runtime_context().get_node_id(), placed)
        init_method = f"tcp://{ray.util.get_node_ip_address()}:{get_open_port()}"
        self.refs = [a.run.remote(self.config, rank, init_method, self.backend)
                     for rank, a in enumerate(self.actors, 1)]
        return init_method

    def _pick_driver_gpu(self, node: str, placed: list) -> None:
        """The driver takes a GPU of its node that no rank of this group was given."""
        taken = {g for n, gpus in placed if n == node for g in gpus}
        free = [i for i in range(torch.cuda.device_count()) if i not in taken]
        if not free:
            raise ValueError("every GPU of the driver's node went to other ranks; the driver "
                             "(rank 0) needs one")
        self.config.device = torch.device("cuda", free[0])

    def _check_ranks(self) -> None:
        import ray
        done, _ = ray.wait(self.refs, timeout=0)
        if done:
            ray.get(done)  # raises the rank's error
            raise RuntimeError("a tensor-parallel rank actor ended during start-up")

    def _stop_ranks(self) -> None:
        import ray
        if not ray.is_initialized():
            return
        try:
            if getattr(self, "refs", None):
                ray.wait(self.refs, num_returns=len(self.refs), timeout=30)
        finally:
            for actor in getattr(self, "actors", []):
                ray.kill(actor)
            if getattr(self, "pg", None) is not None:
                from ray.util.placement_group import remove_placement_group
                remove_placement_group(self.pg)
            if getattr(self, "_owns_ray", False):
                ray.shutdown()
