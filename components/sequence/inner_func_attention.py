"""InnerFuncAttention: attention whose value is an inner function of the input, with a dynamic mask.

The attention is one engine with two injected parts, each a small module with one contract:

    value     ``Value(d_model, *, kv_width, **options)``; ``.width``; ``forward(x [B,T,d], context) → [B,T,width]``
    key bias  ``KeyBias(*, n_heads, value_heads, head_dim, **options)``; ``forward(v [B,T,width], context) → [B,H,T]``

``kv_width = n_kv_heads · head_dim`` is the keys' width, which a value may take (the linear value) or not
(the retrieval and SSD values map ``d_model → d_model``); the value's heads are ``width // head_dim``. A
recipe names a part (``inner: retrieval``) or gives its class and options
(``inner: {class_path: retrieval, init_args: {n_values: 6}}``, where ``class_path`` is a name below or a
dotted path to any class with the contract): a new value or mask is a new class, not a new branch here.
"""

from collections.abc import Mapping
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from components._checks import check_divisible, check_flags, check_mixer_input, check_on_device, check_positive
from components.context import Context
from components.flops import attention_flops_per_token
from components.sequence.attention import QueryKeyPositions
from components.sequence.ssd import SSD
from zoo_kernels._backend import check_backend


class LinearValue(nn.Linear):
    """``V = x W_V``, ``[..., d_model] → [..., kv_width]``: one value head per key head (Doge's value)."""

    def __init__(self, d_model: int, *, kv_width: int):
        super().__init__(d_model, kv_width, bias=False)
        self.width = kv_width

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        return super().forward(x)


class RetrievedValue(nn.Module):
    """Wonderful Matrices v2 §3.2's retrieval inner function, ``[..., d] → [..., d]``::

        g = (x W_vQ) θ_vKᵀ ∈ [..., n_values]      top-k of g → indices i_j, scores g_j
        V = x ⊙ Σ_j softmax(g_topk)_j E[i_j]       E ∈ [n_values, d]

    Weighting the retrieved rows by the softmax of their scores (as PEER does) gives ``W_vQ`` and
    ``θ_vK`` a gradient; the paper's listing sums them unweighted and leaves both untrained.

    Args (defaults as Wonderful Matrices v2 Table 6): ``n_values`` rows of ``E`` (2), ``d_retrieval``
    the query width (``d_model // 2``), ``top_k`` rows retrieved (2; with 1 the softmax of one score is 1
    and ``W_vQ``, ``θ_vK`` get no gradient, as in the paper's listing). ``kv_width`` is not used.
    """

    def __init__(self, d_model: int, *, n_values: int = 2, d_retrieval: int | None = None, top_k: int = 2,
                 kv_width: int | None = None):
        super().__init__()
        d_retrieval = d_model // 2 if d_retrieval is None else d_retrieval
        check_positive("RetrievedValue", n_values=n_values, d_retrieval=d_retrieval, top_k=top_k)
        if top_k > n_values:
            raise ValueError(f"RetrievedValue: top_k={top_k} exceeds n_values={n_values}")
        self.top_k, self.width = top_k, d_model
        self.query = nn.Linear(d_model, d_retrieval, bias=False)  # W_vQ
        self.keys = nn.Parameter(torch.randn(n_values, d_retrieval) / d_retrieval**0.5)  # θ_vK
        self.values = nn.Embedding(n_values, d_model)  # E

    def extra_flops_per_token(self, seq_len: int) -> int:
        """Scoring every value key, and mixing the ``top_k`` retrieved rows (:mod:`components.flops`)."""
        n_values, d_retrieval = self.keys.shape
        return 2 * d_retrieval * n_values + 2 * self.top_k * self.values.embedding_dim

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        scores = self.query(x) @ self.keys.T  # [..., n_values]
        top, index = scores.topk(self.top_k, dim=-1)  # [..., k] each
        weights = torch.softmax(top, dim=-1)  # [..., k]
        mixed = torch.einsum("...k,...kd->...d", weights, self.values(index))  # [..., d]
        return x * mixed


class SSDValue(SSD):
    """``V = SSD(x)``, ``[B, T, d_model] → [B, T, d_model]`` (Wonderful Matrices v1 §4.2): a selective
    recurrent summary as the value. Options are :class:`SSD`'s (default RoPE positions); ``kv_width``
    is not used."""

    def __init__(self, d_model: int, *, kv_width: int | None = None, **ssd_options):
        super().__init__(d_model, **ssd_options)
        self.width = d_model


class ContentBias(nn.Module):
    """``bias[b,h,j] = A_h · softplus((V W_δ)[b,j,h])``, one ``A`` per query head, initialised to 0 so
    training starts as plain attention (Doge's paper, Wonderful Matrices v2)."""

    def __init__(self, *, n_heads: int, value_heads: int, head_dim: int):
        super().__init__()
        self.delta_proj = nn.Linear(value_heads * head_dim, n_heads, bias=False)  # W_δ
        self.A = nn.Parameter(torch.zeros(n_heads))

    def forward(self, v_flat: torch.Tensor, context: Context) -> torch.Tensor:
        # heads-first before the softplus: with a transposed gradient, softplus_backward's real strides
        # differ from the ones aot_autograd traces, and the compiled backward fails on a view
        delta = self.delta_proj(v_flat).transpose(1, 2).contiguous()  # [b, T, H] → [b, H, T]
        return self.A[:, None] * F.softplus(delta)  # [b, H, T]


class ExpContentBias(nn.Module):
    """``bias[b,h,j] = exp(A · softplus((V W_δ)[b,j,·]))``, with one ``A`` and one δ per key/value head
    (``per_kv_head=True``, ``A = 0``: the released Doge models, Hugging Face ``DogeAttention``; at
    ``A = 0`` the bias is 1 everywhere) or per query head (``per_kv_head=False``, ``A = 1``: the
    authors' Cheems code, without its ratio threshold, which ranks every key of the sequence, the
    future ones included)."""

    def __init__(self, *, n_heads: int, value_heads: int, head_dim: int, per_kv_head: bool = True, a_init: float = 0.0):
        super().__init__()
        check_flags("ExpContentBias", per_kv_head=per_kv_head)
        self.per_kv_head, self.n_heads = per_kv_head, n_heads
        n_bias = value_heads if per_kv_head else n_heads
        self.delta_proj = nn.Linear(value_heads * head_dim, n_bias, bias=False)  # W_δ
        self.A = nn.Parameter(torch.full((n_bias,), float(a_init)))

    def forward(self, v_flat: torch.Tensor, context: Context) -> torch.Tensor:
        delta = self.delta_proj(v_flat).transpose(1, 2).contiguous()  # [b, T, n_bias] → [b, n_bias, T], as above
        bias = torch.exp(self.A[:, None] * F.softplus(delta))  # [b, n_bias, T]
        return bias.repeat_interleave(self.n_heads // bias.shape[1], dim=1)  # [b, H, T]


class PositionBias(nn.Module):
    """``bias[h,j] = θ[h, position_j]``, learned over ``max_position`` positions (default 2048)."""

    def __init__(self, *, n_heads: int, value_heads: int, head_dim: int, max_position: int = 2048):
        super().__init__()
        check_positive("PositionBias", max_position=max_position)
        self.max_position = max_position
        self.table = nn.Parameter(torch.zeros(n_heads, max_position))  # θ

    def forward(self, v_flat: torch.Tensor, context: Context) -> torch.Tensor:
        if context.position_ids.numel():
            last = context.position_ids.max()
            rule = f"InnerFuncAttention: positions must lie below the position mask's max_position={self.max_position}"
            check_on_device(last < self.max_position, rule, sync=not self.training, message=lambda: (
                f"InnerFuncAttention: position {int(last)} is past the position mask's max_position={self.max_position}"))
        return self.table[:, context.position_ids].transpose(0, 1)  # [b, H, T]


VALUES = {"linear": LinearValue, "retrieval": RetrievedValue, "ssd": SSDValue}
"""The values a recipe may name (``inner:``)."""

KEY_BIASES = {
    "content": ContentBias,
    "content_exp": partial(ExpContentBias, per_kv_head=True, a_init=0.0),
    "cheems": partial(ExpContentBias, per_kv_head=False, a_init=1.0),
    "position": PositionBias,
    "none": None,
}
"""The key biases (dynamic masks) a recipe may name (``mask:``); ``none``: causal and padding only."""

# Options that were InnerFuncAttention's own before the parts were injected: where each now lives.
MOVED_OPTIONS = {"n_values": ("inner", "retrieval"), "d_retrieval": ("inner", "retrieval"),
                 "top_k": ("inner", "retrieval"), "ssd": ("inner", "ssd"), "max_position": ("mask", "position")}


def upgrade_init_args(init_args: Mapping) -> dict:
    """``InnerFuncAttention`` arguments as recipes and checkpoints wrote them before its parts were injected
    (``n_values``, ``d_retrieval``, ``top_k``, ``ssd``, ``max_position`` beside ``inner``/``mask``), in
    today's form: each option inside its part's ``init_args``; an option of a part not chosen is dropped,
    as it was then ignored; an SSD value's ``positions`` as :class:`SSD` upgrades it. Today's arguments come
    back unchanged."""
    args = dict(init_args)
    defaults = {"inner": "linear", "mask": "content"}
    for key in [key for key in args if key in MOVED_OPTIONS]:
        value = args.pop(key)
        slot, name = MOVED_OPTIONS[key]
        chosen = args.get(slot, defaults[slot])
        if part_name(chosen) != name:
            continue
        options = dict(next(iter(chosen.values())) or {}) if isinstance(chosen, Mapping) else {}
        options.update(value or {} if key == "ssd" else {key: value})
        args[slot] = {name: options}
    inner = args.get("inner")
    if part_name(inner) == "ssd" and isinstance(inner, Mapping):  # the SSD value's own options moved too
        args["inner"] = {"ssd": SSD.upgrade_init_args(inner["ssd"] or {})}
    return args


def build_part(slot: str, spec, registry: dict, **geometry):
    """The module a part spec names: a registry name or dotted class path, alone or as ``{name: options}``."""
    from components.bindings import import_class  # bindings imports the model, which imports this module

    name = part_name(spec)
    options = spec[name] or {} if isinstance(spec, Mapping) and name is not None else {}
    if not isinstance(name, str) or not isinstance(options, Mapping):
        raise ValueError(f"InnerFuncAttention: {slot}={spec!r} must be one of {tuple(registry)} (or a dotted class path), "
                         "alone or as a one-entry mapping {NAME: {option: value, ...}}")
    options = dict(options)
    if name in registry:
        factory = registry[name]
    elif "." in name:
        factory = import_class(name)
    else:
        raise ValueError(f"InnerFuncAttention: {slot}={name!r} is not one of {tuple(registry)} (or a dotted class path)")
    if factory is None:
        if options:
            raise ValueError(f"InnerFuncAttention: {slot}={name!r} takes no options, got {sorted(options)}")
        return None
    try:
        return factory(**geometry, **options)
    except TypeError as error:
        raise ValueError(f"InnerFuncAttention: {slot}={name!r} with options {options}: {error}") from error


def part_name(spec) -> str | None:
    """The name a part spec gives (None if it is not one)."""
    if isinstance(spec, str):
        return spec
    return next(iter(spec)) if isinstance(spec, Mapping) and len(spec) == 1 else None


class InnerFuncAttention(nn.Module):
    """Causal attention with an inner-function value and a dynamic mask, ``[B,T,d] → [B,T,d]``.

    Q and K exactly as :class:`QCAttention` (GQA, RoPE or not, optional QK-norm). The value and the key
    bias are injected parts (module docstring), named or given as ``{class_path, init_args}``:

        ``inner``: ``linear`` — :class:`LinearValue` (with ``mask="content_exp"``, Doge's attention);
                   ``retrieval`` — :class:`RetrievedValue` (Wonderful Matrices v2 §3.2);
                   ``ssd`` — :class:`SSDValue` (Wonderful Matrices v1 §4.2).
        ``mask``:  ``content`` — :class:`ContentBias`; ``content_exp`` / ``cheems`` —
                   :class:`ExpContentBias` per key head from 0 (Doge's released models) / per query head
                   from 1 (the Cheems code); ``position`` — :class:`PositionBias`; ``none``.

    ``keep_window=w``: each query keeps only its ``w`` allowed keys with the largest bias.

    Args:
        d_model: model width.
        n_heads: query heads (default 8); ``d_model`` must be divisible by it.
        n_kv_heads: key heads (default ``n_heads``). A value of width ``w`` has ``w // head_dim`` heads
            (the linear value ``n_kv_heads``, the others ``n_heads``); the keys are repeated to match them.
        inner: the value part (default ``linear``).
        mask: the key-bias part (default ``content``).
        keep_window: at most this many keys per query (default None: all).
        rope, qk_norm, norm_eps, rope_fraction: as :class:`QCAttention`.
        backend: attention kernel, ``auto`` | ``reference`` | ``triton``.

    Before the parts were injected, ``n_values``, ``d_retrieval``, ``top_k``, ``ssd`` and ``max_position``
    were arguments of this class; checkpoints and recipes that give them are upgraded when loaded
    (:func:`upgrade_init_args`), and a call that gives them is refused with the form to use.
    """

    mixer_slot = "sequence"  # the block slot it fills; a pattern placing it in the other is refused

    upgrade_init_args = staticmethod(upgrade_init_args)

    def __init__(
        self,
        d_model: int,
        *,
        n_heads: int = 8,
        n_kv_heads: int | None = None,
        inner: str | Mapping = "linear",
        mask: str | Mapping = "content",
        keep_window: int | None = None,
        rope: bool = True,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        rope_fraction: float = 1.0,
        backend: str = "auto",
        **moved,
    ):
        super().__init__()
        if moved:
            hint = upgrade_init_args({"inner": inner, "mask": mask, **moved})
            unknown = sorted(set(moved) - set(MOVED_OPTIONS))
            raise TypeError(f"InnerFuncAttention: unexpected argument(s) {unknown}" if unknown else (
                f"InnerFuncAttention: {sorted(moved)} are options of the value or mask part now; write "
                f"inner={hint['inner']!r}, mask={hint['mask']!r}"))
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_backend(backend, "InnerFuncAttention")
        check_positive("InnerFuncAttention", d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads)
        check_divisible("InnerFuncAttention", "d_model", d_model, "n_heads", n_heads)
        check_divisible("InnerFuncAttention", "n_heads", n_heads, "n_kv_heads", n_kv_heads)
        if keep_window is not None and (not isinstance(keep_window, int) or keep_window < 1):
            raise ValueError(f"InnerFuncAttention: keep_window={keep_window!r} must be an integer >= 1 (or None)")
        self.head_dim = d_model // n_heads
        self.positions = QueryKeyPositions("InnerFuncAttention", self.head_dim, rope=rope, qk_norm=qk_norm,
                                           norm_eps=norm_eps, rope_fraction=rope_fraction)
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.keep_window, self.backend = keep_window, backend

        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.value = build_part("inner", inner, VALUES, d_model=d_model, kv_width=n_kv_heads * self.head_dim)
        width = self.value.width
        if width % self.head_dim or n_heads % max(width // self.head_dim, 1) or not width:
            raise ValueError(f"InnerFuncAttention: the value's width {width} must be a multiple of head_dim={self.head_dim} "
                             f"giving a number of heads that divides n_heads={n_heads}")
        self.v_heads = width // self.head_dim
        self.key_bias = build_part("mask", mask, KEY_BIASES, n_heads=n_heads, value_heads=self.v_heads, head_dim=self.head_dim)
        self.inner, self.mask = part_name(inner), part_name(mask)  # for summaries
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        self.register_load_state_dict_pre_hook(_rename_flat_mask_parameters)

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, self.q_proj.weight, sequence=True)
        context = Context.for_input(type(self).__name__, x, context)
        x = context.zero_padding(x)
        batch, T, _ = x.shape
        q = self.q_proj(x).view(batch, T, self.n_heads, self.head_dim)  # [b, T, H, Dh]
        k = self.k_proj(x).view(batch, T, self.n_kv_heads, self.head_dim)  # [b, T, Hkv, Dh]
        v_flat = self.value(x, context)  # [b, T, v_heads·Dh]
        v = v_flat.view(batch, T, self.v_heads, self.head_dim)  # [b, T, Hv, Dh]
        q, k = self.positions(q, k, context)
        bias = self.key_bias(v_flat, context) if self.key_bias is not None else None  # [b, H, T]
        # Under autocast the projections give half q and k, but the retrieved value x ⊙ Σ w·E keeps x's fp32:
        # the attention takes one dtype (as autocast's own SDPA would cast them).
        v = v.to(q.dtype)
        y = context.attend(self, q, k, v, bias=bias, keep_window=self.keep_window, backend=self.backend)  # [b, T, H, Dh]
        return self.out_proj(y.reshape(batch, T, self.n_heads * self.head_dim))

    def extra_flops_per_token(self, seq_len: int) -> int:
        """Scores and weighted sum beyond the projections and the value's own work (:mod:`components.flops`)."""
        return attention_flops_per_token(seq_len, self.n_heads, self.head_dim)

    def extra_repr(self) -> str:
        return (f"inner={self.inner}, mask={self.mask}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"keep_window={self.keep_window}")


# Where the masks' parameters lived before they were parts: ``A`` and ``delta_proj`` and ``position_bias``
# on the attention itself.
_FLAT_MASK_PARAMETERS = {"A": "key_bias.A", "delta_proj.weight": "key_bias.delta_proj.weight",
                         "position_bias": "key_bias.table"}


def _rename_flat_mask_parameters(module, state_dict, prefix, *args) -> None:
    """Load a state dict written before the key bias was a part (its parameters then sat on the attention)."""
    for old, new in _FLAT_MASK_PARAMETERS.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)
