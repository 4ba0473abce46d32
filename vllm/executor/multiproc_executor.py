"""Tensor parallelism on one host: one process per rank beyond the driver (each on a GPU of its
own, or a CPU process), meeting the driver at a free local port. Ranks start as fresh interpreters
(`python -m vllm.executor.multiproc_executor`, their arguments pickled on stdin), so the
caller's script is never re-imported and needs no `if __name__ == "__main__"` guard."""
import os
import pickle
import subprocess
import sys
import weakref

import torch

import vllm
from vllm.distributed.parallel_state import destroy_distributed, get_open_port
from vllm.executor.distributed_executor import DistributedExecutor, run_rank
from vllm.process_utils import die_with_parent


def _stop(procs: list, timeout: float = 10.0) -> None:
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
    for p in procs:
        try:
            p.wait(5.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5.0)


def _release(procs: list) -> None:
    _stop(procs, 0.0)
    destroy_distributed()


class MultiprocExecutor(DistributedExecutor):

    def _start_ranks(self) -> str:
        init_method = f"tcp://127.0.0.1:{get_open_port()}"
        env = dict(os.environ)
        # the ranks import this copy of vllm, whatever put it on the driver's path
        root = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.procs = []
        # ends the processes too when the executor is dropped without shutdown()
        self._finalizer = weakref.finalize(self, _release, self.procs)
        for rank, device_index in zip(range(1, self.size), self._other_gpus()):
            p = subprocess.Popen([sys.executable, "-m", "vllm.executor.multiproc_executor"],
                                 stdin=subprocess.PIPE,
                                 env={**env, "VLLM_PROCESS_NAME": f"TPRank{rank}"})
            self.procs.append(p)
            p.stdin.write(pickle.dumps((self.config, rank, init_method, self.backend,
                                        device_index)))
            p.stdin.close()
        return init_method

    def _other_gpus(self) -> list[int]:
        """The GPUs of ranks 1.. in order, all but the driver's (none used on the CPU)."""
        if self.config.device.type != "cuda":
            return list(range(1, self.size))
        count = torch.cuda.device_count()
        return [i for i in range(count) if i != self.config.device.index][:self.size - 1]

    def _check_ranks(self) -> None:
        dead = [(rank, p.returncode) for rank, p in enumerate(self.procs, 1)
                if p.poll() is not None]
        if dead:
            raise RuntimeError(f"tensor-parallel rank process(es) (rank, exit code) {dead} "
                               "exited during start-up (see their log above)")

    def _stop_ranks(self) -> None:
        _stop(getattr(self, "procs", []))
        if hasattr(self, "_finalizer"):
            self._finalizer.detach()


if __name__ == "__main__":
    die_with_parent()  # a rank never outlives its driver
    run_rank(*pickle.load(sys.stdin.buffer))
