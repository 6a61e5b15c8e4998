"""Cross-entropy through a linear head, without writing the logits.

    loss = Σ_{i : y_i ≠ ignore}  logsumexp_v(h_i · W_v) − h_i · W_{y_i}

``F.cross_entropy(hidden @ weight.t(), labels)`` writes the ``[N, V]`` logits, reads them again for the
log-softmax, and its backward reads and writes arrays of that size twice more (the softmax's gradient and
the one-hot scatter). At a 4,096-token vocabulary and 2,048 tokens a step those passes over 32 MB took about
a third of a small model's CPU training step. :func:`linear_cross_entropy` takes the rows in chunks whose
logits stay in cache and forms each chunk's gradients at once, in the forward::

    dL/dh_i = (p_i − onehot(y_i)) · W          dL/dW = Σ_i (p_i − onehot(y_i))ᵀ h_i      (p = softmax)

The sum is the loss's last op, so its backward only scales those by the incoming gradient (the technique
of Liger-Kernel's fused linear cross-entropy and Apple's Cut Cross-Entropy, here in plain torch). Products
run in the inputs' dtype (as the ``nn.Linear`` head would), the softmax and the sums in fp32.
:func:`linear_cross_entropy_reference` is the plain form it is tested against.

PaLM's z-loss (``z_loss = c``) adds ``c · logsumexp_v(h_i · W_v)²`` per kept row, which keeps the log-partition
near 0; its gradient joins the softmax's: ``p_i · (1 + 2c · logsumexp_i) − onehot(y_i)``.
"""

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

IGNORE_INDEX = -100  # the label that carries no loss (torch's cross_entropy default); the recipes take it from here
# Logit elements per chunk: 4 MiB of fp32 on a CPU (measured: 256 rows at V = 4,096 beat 128 and 512, one
# thread); larger on a GPU, where each chunk is a handful of kernel launches (not yet measured on one).
CHUNK_ELEMENTS = {"cpu": 2**20}
DEFAULT_CHUNK_ELEMENTS = 2**24


def linear_cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                   ignore_index: int = IGNORE_INDEX, z_loss: float = 0.0) -> torch.Tensor:
    """The plain form: ``F.cross_entropy`` of the written-out logits (at least fp32), summed over the kept rows, plus
    ``z_loss`` times their summed ``logsumexp²``."""
    logits = hidden @ weight.t()  # [N, V]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    ce = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    return ce + z_loss * logits[labels != ignore_index].logsumexp(dim=-1).square().sum()


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                         ignore_index: int = IGNORE_INDEX, chunk_rows: int | None = None,
                         z_loss: float = 0.0) -> torch.Tensor:
    """The summed cross-entropy of the logits ``hidden @ weight.t()`` against ``labels``, never written whole.

    Args:
        hidden: ``[N, d]`` the head's input (after the final norm).
        weight: ``[V, d]`` the head's weight (``nn.Linear(d, V, bias=False).weight``).
        labels: ``[N]`` integer ids in ``[0, V)``, or ``ignore_index`` for a row without loss.
        chunk_rows: rows per chunk (default: about 2^20 logits a chunk on a CPU, 2^24 elsewhere).
        z_loss: PaLM's z-loss coefficient: ``z_loss · logsumexp²`` of each kept row joins the sum (default 0).
    Returns: an fp32 scalar (fp64 for fp64 inputs), the sum over the kept rows (divide by their count for the mean); 0 if none.
    """
    return linear_cross_entropy_parts(hidden, weight, labels, ignore_index=ignore_index, chunk_rows=chunk_rows,
                                      z_loss=z_loss)[0]


def linear_cross_entropy_parts(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                               ignore_index: int = IGNORE_INDEX, chunk_rows: int | None = None,
                               z_loss: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`linear_cross_entropy`, and the summed ``logsumexp²`` of the kept rows (detached: what ``z_loss``
    multiplies, for a log that keeps the cross-entropy apart)."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: hidden must be [N, d] and weight [V, d] with the same d; got "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1] or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"linear_cross_entropy: labels must be [N] = {tuple(hidden.shape[:1])} integer ids; got "
                         f"{labels.dtype} {tuple(labels.shape)}")
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_ELEMENTS.get(hidden.device.type, DEFAULT_CHUNK_ELEMENTS) // weight.shape[0])
    if chunk_rows < 1:
        raise ValueError(f"linear_cross_entropy: chunk_rows={chunk_rows} must be >= 1")
    if isinstance(z_loss, bool) or not isinstance(z_loss, (int, float)) or not z_loss >= 0 or z_loss == float("inf"):
        raise ValueError(f"linear_cross_entropy: z_loss={z_loss!r} must be a finite number >= 0")
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        total, squares = _LinearCrossEntropy.apply(hidden, weight, labels, ignore_index, chunk_rows, z_loss)
        return total, squares.detach()
    total, squares, _, _ = _chunked(hidden, weight, labels, ignore_index, chunk_rows, z_loss, grads=False)
    return total, squares


def _chunked(hidden, weight, labels, ignore_index, chunk_rows, z_loss, grads, want=(True, True)):
    """``(loss, Σ logsumexp², dL/dhidden [N, d] or None, dL/dweight [V, d] at least fp32 or None)`` chunk by
    chunk."""
    exact = torch.promote_types(torch.promote_types(hidden.dtype, weight.dtype), torch.float32)  # fp32, or fp64
    total = hidden.new_zeros((), dtype=exact)
    squares = hidden.new_zeros((), dtype=exact)
    grad_hidden = torch.empty_like(hidden) if grads and want[0] else None  # [N, d]
    grad_weight = torch.zeros_like(weight, dtype=exact) if grads and want[1] else None  # [V, d]
    for start in range(0, hidden.shape[0], chunk_rows):
        y = labels[start:start + chunk_rows]  # [n]
        keep = y != ignore_index  # [n]
        # an ignored row (padding, say) may hold anything, NaN included: zeroed, it adds nothing anywhere
        h = hidden[start:start + chunk_rows].masked_fill(~keep[:, None], 0.0)  # [n, d]
        target = y.masked_fill(~keep, 0)[:, None]  # [n, 1]: any id for an ignored row
        logits = (h @ weight.t()).to(exact)  # [n, V]
        picked = logits.gather(1, target)[:, 0]  # [n] the label's logit
        if not grads:
            lse = torch.logsumexp(logits, dim=-1)  # [n]
            total += torch.where(keep, lse - picked + z_loss * lse.square(), 0.0).sum()
            squares += torch.where(keep, lse.square(), 0.0).sum()
            continue
        top = logits.amax(dim=-1, keepdim=True)  # [n, 1]
        e = logits.sub_(top).exp_()  # [n, V] exp(logit − max), in the logits' storage
        sums = e.sum(dim=-1, keepdim=True)  # [n, 1]
        lse = top + sums.log()  # [n, 1]
        # log-sum-exp − the label's logit (+ the z-loss)
        total += torch.where(keep, lse[:, 0] - picked + z_loss * lse[:, 0].square(), 0.0).sum()
        squares += torch.where(keep, lse[:, 0].square(), 0.0).sum()
        scale = keep[:, None] / sums if not z_loss else keep[:, None] * (1 + 2 * z_loss * lse) / sums  # [n, 1]
        g = e.mul_(scale)  # [n, V] the softmax on kept rows (by 1 + 2c·lse with a z-loss), 0 on ignored ones: one pass
        g.scatter_add_(1, target, -keep[:, None].to(g.dtype))  # − one-hot at the label (kept rows)
        g = g.to(weight.dtype)
        if grad_hidden is not None:
            grad_hidden[start:start + chunk_rows] = g @ weight  # [n, d]
        if grad_weight is not None:
            grad_weight += g.t() @ h  # [V, d]
    return total, squares, grad_hidden, grad_weight


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, ignore_index, chunk_rows, z_loss):
        total, squares, grad_hidden, grad_weight = _chunked(hidden, weight, labels, ignore_index, chunk_rows, z_loss,
                                                            grads=True, want=ctx.needs_input_grad[:2])
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(squares)
        return total, squares

    @staticmethod
    @once_differentiable  # the gradients were formed without a graph: a second derivative raises, not returns 0
    def backward(ctx, grad_total, _):
        grad_hidden, grad_weight = ctx.saved_tensors
        dh = grad_hidden * grad_total.to(grad_hidden.dtype) if grad_hidden is not None else None
        dw = (grad_weight * grad_total).to(ctx.weight_dtype) if grad_weight is not None else None
        return dh, dw, None, None, None, None
