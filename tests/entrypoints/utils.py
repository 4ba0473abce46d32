"""RemoteServer: a real `python -m vllm.entrypoints.openai.api_server` process on 127.0.0.1 and a
free port, started in a test, waited for on /health, and stopped at the end."""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx

from vllm.distributed.parallel_state import get_open_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180


free_port = get_open_port  # a port nothing listens on now


class RemoteServer:

    def __init__(self, model: str, extra_args: list[str], api_key: Optional[str] = None,
                 served_name: str = "test-model", cli: bool = False) -> None:
        """cli: start it as `vllm serve MODEL` (the console command's module) instead."""
        self.port = free_port()
        self.api_key = api_key
        self.served_name = served_name
        entry = (["vllm.entrypoints.cli.main", "serve", model] if cli
                 else ["vllm.entrypoints.openai.api_server", "--model", model])
        args = [sys.executable, "-m", *entry, "--device", "cpu", "--dtype", "float32",
                "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", served_name,
                "--uvicorn-log-level", "warning", *extra_args]
        if api_key:
            args += ["--api-key", api_key]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-server-", suffix=".log")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("VLLM_API_KEY", None)
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_tail(self, n: int = 4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-n:]

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                if httpx.get(self.url("/health"), timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"the server was not healthy after {START_TIMEOUT_S} s:\n"
                           f"{self.log_tail()}")

    def client(self, **kwargs):
        import openai
        return openai.OpenAI(base_url=self.url("/v1"), api_key=self.api_key or "none",
                             max_retries=0, timeout=120, **kwargs)

    def async_client(self, **kwargs):
        import openai
        return openai.AsyncOpenAI(base_url=self.url("/v1"), api_key=self.api_key or "none",
                                  max_retries=0, timeout=120, **kwargs)

    def metrics(self) -> dict[str, float]:
        """Every sample on /metrics: 'name{label="v",...}' (labels sorted) -> value."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url("/metrics"), timeout=10).text
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                samples[f"{s.name}{{{labels}}}"] = s.value
        return samples

    def metric(self, name: str, **labels: str) -> float:
        labels = {"model_name": self.served_name, **labels}
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
        return self.metrics()[key]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()

    def __enter__(self) -> "RemoteServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
