"""CDMoE's retrieval: ``product_key_topk`` and ``expert_mix`` (the gather-and-mix). See README.md."""

import torch
import torch.nn.functional as F

from zoo_kernels._backend import check_backend, resolve_backend
from zoo_kernels.retrieval.reference import expert_mix_reference, product_key_topk

__all__ = ["ACTIVATIONS", "expert_mix", "expert_mix_reference", "product_key_topk"]

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def expert_mix(
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    down: torch.Tensor,
    up: torch.Tensor,
    *,
    act: str = "silu",
    backend: str = "auto",
) -> torch.Tensor:
    """``y_m = Σ_{h,k} weights[m,h,k] · act(⟨x_m, down[e]⟩) · up[e]``, ``e = experts[m,h,k]``.

    Args:
        x: ``[M, d]`` what the experts read (CDMoE: the cross-domain state, or the input).
        experts: ``[M, H, k]`` integer expert ids in ``[0, N)``.
        weights: ``[M, H, k]`` mixing weights (CDMoE: softmax of the retrieval scores per head).
        down, up: ``[N, d]`` the one-neuron experts' input and output rows.
        act: ``silu`` | ``gelu`` | ``relu`` (default ``silu``).
        backend: ``auto`` | ``reference`` | ``triton``.

    Returns:
        ``[M, d]`` in ``x``'s dtype.
    """
    check_backend(backend, "expert_mix")
    if act not in ACTIVATIONS:
        raise ValueError(f"expert_mix: act={act!r} is not one of {tuple(ACTIVATIONS)}")
    if x.dim() != 2 or down.dim() != 2 or down.shape != up.shape or down.shape[1] != x.shape[1]:
        raise ValueError(
            f"expert_mix: need x [M, d] and down, up [N, d] with the same d; got x {tuple(x.shape)}, "
            f"down {tuple(down.shape)}, up {tuple(up.shape)}"
        )
    if experts.dim() != 3 or experts.shape[0] != x.shape[0] or weights.shape != experts.shape:
        raise ValueError(
            f"expert_mix: experts and weights must both be [M={x.shape[0]}, H, k]; got experts "
            f"{tuple(experts.shape)}, weights {tuple(weights.shape)}"
        )
    if experts.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"expert_mix: experts must hold integer ids; got {experts.dtype}")
    if resolve_backend(backend, x, op="expert_mix", has_triton=True) == "triton":
        from zoo_kernels.retrieval.triton import expert_mix_triton  # imports triton only when asked for

        return expert_mix_triton(x, experts, weights, down, up, act)
    return expert_mix_reference(x, experts, weights, down, up, ACTIVATIONS[act]).to(x.dtype)
