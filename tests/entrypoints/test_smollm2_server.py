"""The server on the real SmolLM2-135M-Instruct GGUF: a chat completion through the GGUF's own
chat template answers the question, and streams the same text."""
import pytest

from tests.entrypoints.utils import RemoteServer

MODEL = "smollm2"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    with RemoteServer(str(smollm2_gguf), ["--max-model-len", "512"], served_name=MODEL) as srv:
        yield srv


def test_smollm2_chat(server):
    client = server.client()
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24,
                                         temperature=0.0)
    text = out.choices[0].message.content
    assert "Paris" in text, text
    assert out.usage.prompt_tokens > 10 and out.choices[0].finish_reason in ("stop", "length")
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24,
                                            temperature=0.0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
