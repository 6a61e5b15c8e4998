import math
import os

import pytest
import torch

# Under pytest-xdist (addopts: -n 2) each worker takes one core: two workers with two threads each
# would oversubscribe the two cores CI has. Tests that launch their own processes are unaffected.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def rope_by_hand(v: torch.Tensor, pos: int, base: float = 10000.0) -> torch.Tensor:
    """Rotate-half RoPE of one vector, written out: the pair (i, i + n/2) turns by pos·base^(-2i/n)."""
    n = v.shape[-1]
    out = v.clone()
    for i in range(n // 2):
        angle = pos * base ** (-2 * i / n)
        a, b = v[i], v[i + n // 2]
        out[i] = a * math.cos(angle) - b * math.sin(angle)
        out[i + n // 2] = b * math.cos(angle) + a * math.sin(angle)
    return out


@pytest.fixture
def rope_reference():
    return rope_by_hand


def check_causal(fn, x: torch.Tensor, cut_points=(0, 3, None)) -> None:
    """Changing inputs after position t leaves outputs up to t unchanged, and does change later ones
    (so the check could fail: the function really mixes across positions)."""
    T = x.shape[1]
    y = fn(x)
    for t in cut_points:
        t = T - 2 if t is None else t
        x2 = x.clone()
        x2[:, t + 1:] = torch.randn_like(x2[:, t + 1:]) if x.is_floating_point() else torch.randint_like(x2[:, t + 1:], 0, int(x.max()) + 1)
        y2 = fn(x2)
        torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(y2[:, t + 1:], y[:, t + 1:]), f"outputs after {t} did not react to their inputs"


@pytest.fixture
def assert_causal():
    return check_causal


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
