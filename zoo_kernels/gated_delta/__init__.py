"""``gated_delta_rule``: the gated delta rule of Gated DeltaNet (chunked), and ``gated_delta_step`` for decoding.

Two backends: the plain-torch chunked form (``reference``), and ``triton``, which runs the recurrence over chunks in one
kernel launch (the rest is the same torch code). README.md beside this file gives the math and the cost.
"""

import torch

from zoo_kernels._backend import KERNEL_DTYPES, check_backend, resolve_backend, without_autocast
from zoo_kernels._finite import poison, seen_so_far, split_finite
from zoo_kernels.gated_delta.reference import gated_delta_chunked, gated_delta_recurrent, gated_delta_step

__all__ = ["REFERENCE_CHUNK", "gated_delta_chunked", "gated_delta_recurrent", "gated_delta_rule", "gated_delta_step"]

REFERENCE_CHUNK = 64
"""The longest chunk the plain-torch path takes, whatever ``chunk_size`` says: the result does not depend on the chunk
length (up to rounding), and the per-chunk ``[L, L]`` products and solve grow with it (README.md)."""


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    document_starts: torch.Tensor | None = None,
    check_finite: bool = True,
    backend: str = "auto",
):
    """The gated delta rule over a sequence, with the arguments of flash-linear-attention's ``chunk_gated_delta_rule``
    (``q`` and ``k`` already L2-normalised: the rule assumes unit keys; heads of ``q`` and ``k`` already repeated to
    ``v``'s).

    Args:
        q, k: ``[B, T, H, K]`` queries and (unit) keys.
        v: ``[B, T, H, V]`` values.
        g: ``[B, T, H]`` log-decays, <= 0 (the state is multiplied by ``exp(g)`` before each write).
        beta: ``[B, T, H]`` write strengths, in ``[0, 1]`` (``[0, 2]`` lets the transition's eigenvalue along ``k`` reach -1).
        scale: the queries' scale (default ``K ** -0.5``).
        chunk_size: positions per chunk (default 64; at most ``REFERENCE_CHUNK`` is taken: the same result, cheaper).
        initial_state: ``[B, H, K, V]`` state before the first position, or None (zeros).
        return_final_state: also return the state after the last position.
        document_starts: ``[B, T]`` bool, True where a packed document begins: the state is reset there.
        check_finite: take non-finite entries out and put their reach back as NaN (default True), so a NaN reaches
            only the outputs at and after it in its document, as in the recurrence (the chunked form's masked products
            would send 0 · NaN to the past); False skips the pass for inputs known to be finite.
        backend: ``auto`` (Triton on CUDA tensors in fp32/bf16/fp16, the reference otherwise) | ``reference`` |
            ``triton`` (the recurrence over chunks in one kernel; it and the rest compute in fp32).

    Returns:
        ``y [B, T, H, V]`` in ``v``'s dtype, or ``(y, final_state [B, H, K, V])`` (fp32, or float64 for float64
        inputs) with ``return_final_state``. Computes in at least fp32 whatever the inputs and autocast say.
    """
    check_backend(backend, "gated_delta_rule")
    _check_arguments(q, k, v, g, beta, chunk_size, initial_state, document_starts)
    batch, T, H, K = k.shape
    scale = K ** -0.5 if scale is None else scale
    wide = torch.promote_types(v.dtype, torch.float32)
    if T == 0:  # an empty sequence: no output, and the state passes through unchanged
        state = initial_state if initial_state is not None else v.new_zeros(batch, H, K, v.shape[-1], dtype=wide)
        return (v.new_zeros(v.shape), state) if return_final_state else v.new_zeros(v.shape)
    if check_finite:
        (q, bad_q), (k, bad_k), (v, bad_v) = split_finite(q, 1), split_finite(k, 1), split_finite(v, 1)
        (g, bad_g), (beta, bad_beta) = split_finite(g, 0), split_finite(beta, 0)
        written = seen_so_far(bad_k | bad_v | bad_g | bad_beta, document_starts)  # [B, T, H]: what entered the state
        reach, last = written | bad_q, written[:, -1]  # [B, T, H], [B, H]
    chunked = gated_delta_chunked
    if resolve_backend(backend, v, op="gated_delta_rule", has_triton=v.dtype in KERNEL_DTYPES) == "triton":
        from zoo_kernels.gated_delta.triton import gated_delta_triton as chunked  # imports triton only when asked for
    with without_autocast(v.device.type):  # decays are exponentials of long sums, which bf16 cannot hold
        up = lambda t: None if t is None else t.to(wide)  # noqa: E731
        y, state = chunked(up(q), up(k), up(v), up(g), up(beta), scale=scale,
                           chunk_size=min(chunk_size, REFERENCE_CHUNK), initial_state=up(initial_state),
                           document_starts=document_starts)
    y = y.to(v.dtype)
    if check_finite:
        y, state = poison(y, reach), poison(state, last)
    return (y, state) if return_final_state else y


def _check_arguments(q, k, v, g, beta, chunk_size, initial_state, document_starts) -> None:
    """Name the argument whose shape disagrees (a shape error from inside a product, else)."""
    if k.dim() != 4:
        raise ValueError(f"gated_delta_rule: k must be [B, T, H, K]; got shape {tuple(k.shape)}")
    batch, T, H, K = k.shape
    wrong = [f"{name}{tuple(t.shape)} (want {want})" for name, t, want, ok in (
        ("q", q, "[B, T, H, K] as k", q.shape == k.shape),
        ("v", v, "[B, T, H, V]", v.dim() == 4 and v.shape[:3] == (batch, T, H)),
        ("g", g, "[B, T, H]", g.shape == (batch, T, H)),
        ("beta", beta, "[B, T, H]", beta.shape == (batch, T, H))) if not ok]
    if wrong:
        raise ValueError(f"gated_delta_rule: k is [B, T, H, K] = {tuple(k.shape)}; got {', '.join(wrong)}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"gated_delta_rule: chunk_size={chunk_size!r} must be a positive integer")
    if initial_state is not None and tuple(initial_state.shape) != (batch, H, K, v.shape[-1]):
        raise ValueError(f"gated_delta_rule: initial_state must be [B, H, K, V] = {(batch, H, K, v.shape[-1])}; "
                         f"got {tuple(initial_state.shape)}")
    if document_starts is not None and (tuple(document_starts.shape) != (batch, T) or document_starts.dtype != torch.bool):
        raise ValueError(f"gated_delta_rule: document_starts must be a bool [B, T] = {(batch, T)}; got "
                         f"{document_starts.dtype} {tuple(document_starts.shape)}")
