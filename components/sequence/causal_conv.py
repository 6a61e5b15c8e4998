"""The depthwise causal convolution that the SSD (Mamba-2's conv before the scan) and LFM2's gated short
convolution share, with its decoding window and its document boundaries."""

import torch
import torch.nn.functional as F
from torch import nn

from components.cache import InferenceCache


def causal_conv(owner: nn.Module, conv: nn.Conv1d, x: torch.Tensor, cache: InferenceCache | None,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Depthwise causal conv of ``x [b, T, C]`` by ``conv`` (its weights ``[C, 1, K]`` and bias, if any; never its own
    padding): each output reads its input and the ``K - 1`` before it, which are zeros before the sequence, or (decoding)
    the window the last call left in ``owner``'s entry ``conv`` of ``cache``; with ``document_ids [b, T]``, only those
    of its own document. Returns ``[b, T, C]`` in ``x``'s dtype on every path (as ``F.conv1d`` gives it under autocast:
    the taps below would promote a half-precision ``x`` to the fp32 weights' dtype, so a CPU run under autocast would
    hand the mixer fp32 activations where a GPU's hands it half ones)."""
    K = conv.kernel_size[0]
    if x.shape[1] == 0:
        return x
    window = cache.state(owner).get("conv") if cache is not None else None
    if window is None:
        window = x.new_zeros(x.shape[0], K - 1, x.shape[2])  # [b, K-1, C]
    full = torch.cat([window, x], dim=1)  # [b, K-1+T, C]
    if cache is not None:
        # a copy, not a view (as the token shift's): a view would keep the prompt's whole input alive
        cache.keep(owner, "conv", full[:, full.shape[1] - (K - 1):].contiguous(), x.shape[1])  # [b, K-1, C]
    bias = conv.bias if conv.bias is not None else x.new_zeros(())
    if x.shape[1] == 1 and document_ids is None:  # a decoding step: K products per channel, a tenth of a conv
        return ((full * conv.weight[:, 0].t()).sum(dim=1, keepdim=True) + bias).to(x.dtype)  # [b, 1, C]
    if document_ids is None and not full.is_cpu:
        # torch's depthwise conv (cuDNN on a GPU), on [b, C, T] views; the taps below are untimed on a GPU
        out = F.conv1d(full.transpose(1, 2), conv.weight, conv.bias, groups=full.shape[2])  # [b, C, T]
        return out.transpose(1, 2)
    # K fused multiply-adds over [b, T, C], contiguous in C: on a CPU conv1d's forward and backward (and the SiLU
    # after it, on its transposed output) cost 1.4× these (docs/performance.md, "The SSD's causal conv")
    T = x.shape[1]
    if document_ids is not None:  # tap k reads position t - (K-1-k); it counts only within t's document
        ids = F.pad(document_ids, (K - 1, 0), value=-1)  # [b, K-1+T]; the zeros before belong to none
    out = bias
    for k in range(K):
        tap = full[:, k:k + T]  # [b, T, C]
        if document_ids is not None:  # selected away, not multiplied by 0: a NaN before the document stays out
            tap = torch.where((ids[:, k:k + T] == document_ids)[..., None], tap, 0.0)
        out = torch.addcmul(out, tap, conv.weight[:, 0, k])
    return out.to(x.dtype)
