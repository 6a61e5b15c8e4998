import dataclasses
import importlib.util
import math
import os

import numpy as np
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
# anything that might import it (tests/zoo_kernels/conftest.py says the same, for runs of that folder alone).
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


def triton_interpreter():
    """``triton.runtime.interpreter`` where the kernels run in it (``TRITON_INTERPRET=1``, triton installed), else None."""
    if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None:
        from triton.runtime import interpreter

        return interpreter
    return None


@pytest.fixture(autouse=True, scope="session")
def _interpreter_patches_the_language_once():
    """Triton's interpreter patches the ``triton.language`` modules a kernel's globals name for each launch, restoring
    them after, and again at every call of a ``@triton.jit`` helper inside the kernel (``inspect.getmembers`` over
    the modules, ~0.25 ms; 35K times, a sixth of the time, in one SSD kernel test). A helper whose modules the launch
    has patched already is not patched again; one naming another (``tl.core`` in ``tl.standard``) still is."""
    interpreter = triton_interpreter()
    if interpreter is None or not hasattr(interpreter, "_patch_lang"):
        yield
        return
    import triton.language as tl

    original, patched = interpreter._patch_lang, set()  # the ids of the modules this launch has patched

    def patch_lang(fn):
        modules = {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}
        if patched and modules <= patched:
            return interpreter._LangPatchScope()  # nothing to restore
        launch = not patched
        scope = original(fn)
        patched.update(modules)
        if launch:  # the kernel's own: its restore ends the launch
            restore = scope.restore

            def restored():
                patched.clear()
                restore()

            scope.restore = restored
        return scope

    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(interpreter, "_patch_lang", patch_lang)
        yield


@pytest.fixture(autouse=True, scope="session")
def _interpreter_builds_no_overflow_check_it_would_not_run():
    """For every integer ``+``, ``-`` and ``*`` in a kernel, Triton's front end builds an overflow check — the
    operands cast to int64, the operation again, two comparisons — and hands it to ``device_assert``, which drops it
    unless the options' ``debug`` is on. On a GPU that is compile time, once; the interpreter runs the front end at
    every program of every launch, so it is a third of the time of an SSD kernel test (30 of 81 s under cProfile).
    With ``debug`` off, as here, nothing it builds is ever checked: turning it off changes no result."""
    builder = getattr(triton_interpreter(), "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or options.debug or not getattr(options, "sanitize_overflow", False):
        yield
        return
    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(builder, "options", dataclasses.replace(options, sanitize_overflow=False))
        yield


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


class _InterpreterBounds:
    """Every address a Triton kernel touches under the interpreter, checked against its tensor arguments.

    On a GPU a load or store past a tensor's end reads or corrupts a neighbour (or faults, or not: it is undefined);
    the interpreter reads host memory and never faults, so a mask that admits one row too many goes unseen by output
    comparisons. This wraps the interpreter's memory operations: an address whose mask is on must be the start of an
    element, of the access's width, of one of the running kernel's tensor arguments (of its view: a slice's gaps are
    not its elements). A stray access is withheld (so the test goes on without corrupting memory) and recorded,
    naming the kernel and the nearest argument; the records fail the test at its end.
    """

    def __init__(self, monkeypatch):
        import triton.language as tl
        from triton.runtime import interpreter

        self.mask_of = lambda on: interpreter.TensorHandle(on, tl.int1)
        self.kernel = None
        self.tensors = []  # (name, tensor) of the running kernel
        self.elements = {}  # byte width -> sorted uint64 addresses of the running kernel's tensors' elements
        self.faults = []
        init_args = interpreter.GridExecutor._init_args_hst

        def init_args_recording(executor, args_dev, kwargs):
            args_hst, kwargs_hst = init_args(executor, args_dev, kwargs)
            self._enter(executor.fn.__name__, [*zip(executor.arg_names, args_hst), *kwargs_hst.items()])
            return args_hst, kwargs_hst

        builder = interpreter.interpreter_builder
        load, store, rmw, cas = (builder.create_masked_load, builder.create_masked_store,
                                 builder.create_atomic_rmw, builder.create_atomic_cas)

        def checked_load(ptrs, mask, other, cache_policy, is_volatile):
            return load(ptrs, self._check("load", ptrs, mask), other, cache_policy, is_volatile)

        def checked_store(ptrs, value, mask, cache_policy):
            return store(ptrs, value, self._check("store", ptrs, mask), cache_policy)

        def checked_rmw(op, ptr, val, mask, sem, scope):
            return rmw(op, ptr, val, self._check("atomic", ptr, mask), sem, scope)

        def checked_cas(ptr, cmp, val, sem, scope):
            if not self._check("atomic", ptr, None).data.all():
                raise AssertionError(self.faults[-1])  # a compare-and-swap has no mask to withhold it with
            return cas(ptr, cmp, val, sem, scope)

        monkeypatch.setattr(interpreter.GridExecutor, "_init_args_hst", init_args_recording)
        monkeypatch.setattr(builder, "create_masked_load", checked_load)
        monkeypatch.setattr(builder, "create_masked_store", checked_store)
        monkeypatch.setattr(builder, "create_atomic_rmw", checked_rmw)
        monkeypatch.setattr(builder, "create_atomic_cas", checked_cas)

    def _enter(self, kernel, named_args):
        self.kernel, self.tensors = kernel, []
        for name, arg in named_args:
            parts = arg if isinstance(arg, tuple) else (arg,)
            self.tensors += [(name, t) for t in parts if isinstance(t, torch.Tensor) and t.numel()]
        by_width = {}
        for _, t in self.tensors:  # numpy, not torch: a test profiling torch's allocations must not see these
            offsets = np.zeros((), np.uint64)  # element offsets of the view, from its sizes and strides
            for size, stride in zip(t.shape, t.stride()):
                offsets = offsets[..., None] + np.arange(size, dtype=np.uint64) * np.uint64(stride)  # (*shape[:k+1])
            by_width.setdefault(t.element_size(), []).append(t.data_ptr() + offsets.ravel() * t.element_size())
        self.elements = {w: np.unique(np.concatenate(a)) for w, a in by_width.items()}

    def _check(self, op, ptrs, mask):
        """The access's mask with its stray addresses turned off (recorded, and withheld so the test can go on)."""
        width = ptrs.get_element_ty().primitive_bitwidth // 8
        on = np.ones(ptrs.data.shape, bool) if mask is None else np.broadcast_to(mask.data, ptrs.data.shape) != 0
        allowed = self.elements.get(width, np.zeros(1, np.uint64))
        # allowed is sorted: an address is an element iff it equals the value at its insertion point
        inside = allowed[np.minimum(np.searchsorted(allowed, ptrs.data), allowed.size - 1)] == ptrs.data
        stray = ptrs.data[on & ~inside]
        if stray.size and len(self.faults) < 20:
            self.faults.append(f"{self.kernel}: {op} of {stray.size} {width}-byte element(s) outside its tensors, "
                               f"the first {self._where(int(stray[0]))}")
        return self.mask_of(on & inside)

    def _where(self, address):
        """The stray address against the argument that starts nearest below it."""
        below = [(address - t.data_ptr(), name, t) for name, t in self.tensors if t.data_ptr() <= address]
        if not below:
            return "below every argument"
        offset, name, t = min(below, key=lambda x: x[0])
        last = t.data_ptr() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) * t.element_size()
        return (f"at byte {offset} of `{name}` {tuple(t.shape)} (strides {t.stride()}, its last element at byte "
                f"{last - t.data_ptr()})")

    def take_faults(self) -> list[str]:
        """The faults recorded so far, cleared (a test that plants an overrun takes them, so its end stays clean)."""
        faults, self.faults = self.faults, []
        return faults

    def assert_clean(self):
        if self.faults:
            pytest.fail("\n".join(self.faults), pytrace=False)


@pytest.fixture
def interpreter_bounds():
    """Fails the test if a Triton kernel under the interpreter loads, stores or adds outside its tensors' elements.
    Its own patches: a test's ``monkeypatch.undo()`` leaves them in place."""
    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        pytest.skip("bounds are checked under Triton's interpreter only")
    with pytest.MonkeyPatch.context() as patches:
        bounds = _InterpreterBounds(patches)
        yield bounds
    bounds.assert_clean()


@pytest.fixture(autouse=True)
def _every_kernel_within_bounds(request):
    """Every test runs its Triton kernels under the bounds check (on a GPU there is no interpreter to wrap)."""
    if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None:
        request.getfixturevalue("interpreter_bounds")
