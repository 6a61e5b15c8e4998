import math
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Nothing in the tests downloads: Hugging Face's libraries (transformers, datasets under lm-eval) are told so,
# instead of timing out against a hub that CI cannot reach.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# Without a GPU the Triton kernels run in Triton's interpreter, which must be chosen before triton is first
# imported (it decides then how triton.language's own functions run): here, before any test module imports
# anything that might import it (tests/kernels/conftest.py says the same, for runs of that folder alone).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

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


@pytest.fixture(autouse=True, scope="session")
def _corpus_cache(tmp_path_factory):
    """Token caches (recipes.data.TokenizedCorpus) go to a temporary directory, never the user's home."""
    os.environ["HYBRID_ZOO_CACHE"] = str(tmp_path_factory.mktemp("hybrid-zoo-cache"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


aten = torch.ops.aten
# Ops whose output size or value the host must read back before the next op can be launched.
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
           aten.bincount.default, aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
           aten.repeat_interleave.Tensor, aten.item.default}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


class HostSyncs(TorchDispatchMode):
    """Records every op that makes the host wait on the device: reading a value (``.item()``,
    ``int()``, ``bool()``), a data-dependent output size (``nonzero``, boolean-mask indexing) — and,
    through a patched ``Tensor.tolist`` (it bypasses the dispatcher), ``.tolist()``."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self._tolist = torch.Tensor.tolist

    def __enter__(self):
        tolist, found = self._tolist, self.found

        def recording_tolist(tensor):
            found.append("Tensor.tolist")
            return tolist(tensor)
        torch.Tensor.tolist = recording_tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCING:
            self.found.append(str(func))
        elif func in INDEXING and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                      for i in (args[1] if len(args) > 1 else ())):
            self.found.append(f"{func} with a boolean index")
        return func(*args, **kwargs)


@pytest.fixture
def host_syncs():
    """``with host_syncs() as syncs: ...`` then ``syncs.found`` lists the host syncs the block made."""
    return HostSyncs


class LargestTensor(TorchDispatchMode):
    """Records the number of elements of the largest tensor any op produces inside the ``with`` block (forward or
    backward): a test that a computation never materialises a quadratic tensor asserts on ``.largest``."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.fixture
def largest_tensor():
    """``with largest_tensor() as record: ...`` then ``record.largest`` is the largest tensor's element count."""
    return LargestTensor
