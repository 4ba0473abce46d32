"""argmax_rows (numpy on the CPU) gives torch.argmax's indices: random rows, ties (the first
maximal index), NaN (counted as the maximum, the first one), +-inf, all -inf, every float dtype,
strided rows, a single row; on other devices it is torch.argmax itself."""
import pytest
import torch

from vllm.model_executor.sampler import argmax_rows


def special_rows(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(9, 64).to(dtype)
    x[0, 3] = x[0, 40] = x[0].max() + 1  # a tie: the first index wins
    x[1, 7] = float("nan")
    x[2, 5] = x[2, 50] = float("nan")
    x[3, 11] = float("inf")
    x[4, :] = float("-inf")
    x[5, 20] = float("inf")
    x[5, 30] = float("nan")
    x[6, :] = 0.0  # all equal
    x[7, 63] = x[7].max() + 1  # the last column
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_argmax_rows_equals_torch(dtype):
    for x in (special_rows(dtype), torch.randn(8, 32000).to(dtype),
              (torch.randn(5, 1000) * 3).round().to(dtype),  # many ties
              torch.randn(1, 777).to(dtype), torch.randn(6, 300).to(dtype)[:, ::3],
              torch.randn(12, 100).to(dtype)[::2]):
        got = argmax_rows(x)
        assert got.dtype == torch.int64 and got.device == x.device
        assert torch.equal(got, x.argmax(dim=-1)), dtype


def test_argmax_rows_in_inference_mode():
    with torch.inference_mode():
        x = torch.randn(4, 500)
        assert torch.equal(argmax_rows(x), x.argmax(dim=-1))


def test_argmax_rows_leaves_other_tensors_to_torch():
    x = torch.randint(0, 100, (3, 50))  # an integer tensor: torch's own argmax
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    if torch.cuda.is_available():
        y = torch.randn(4, 300, device="cuda")
        assert torch.equal(argmax_rows(y), y.argmax(dim=-1))
