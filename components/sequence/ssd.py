"""SSD: the Mamba-2 state-space sequence mixer, with two optional sources of position (conv, rope) beside the decay."""

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from components.cache import InferenceCache
from components.flops import ssd_flops_per_token
from components._checks import check_choice, check_divisible, check_flags, check_mixer_input, check_positive
from components.context import Context
from components.norm import GroupedRMSNorm, at_least_fp32
from components.sequence.causal_conv import causal_conv
from components.rotary import apply_rotary
from zoo_kernels._backend import check_backend
from zoo_kernels.ssd import REFERENCE_CHUNK, ssd_scan, ssd_step

# ``positions`` (one string) named the sources before they were separate options: what each meant.
POSITIONS = {"rope": {"conv": False, "rope": True}, "decay": {"conv": False, "rope": False},
             "conv": {"conv": True, "rope": False}, "conv+rope": {"conv": True, "rope": True}}


def upgrade_init_args(init_args: Mapping) -> dict:
    """``SSD`` arguments as recipes and checkpoints wrote them before the position sources were separate
    options (``positions: conv+rope``), in today's form (``conv: true, rope: true``); today's come back
    unchanged."""
    args = dict(init_args)
    if "positions" in args:
        positions = args.pop("positions")
        check_choice("SSD", "positions", positions, tuple(POSITIONS))
        args.update(POSITIONS[positions])
    return args


class SSD(nn.Module):
    """State-space duality (Mamba-2) sequence mixer, ``[B, T, d_model] → [B, T, d_model]``.

    Per head ``h`` (``H`` heads of dim ``P``, state dim ``N``, ``G`` groups for B and C)::

        X = x W_x [B,T,H,P]   B = x W_B, C = x W_C [B,T,G,N]   Δ = softplus(x W_Δ + Δ_bias) [B,T,H]
        state_t = exp(Δ_t A) state_{t-1} + Δ_t X_t ⊗ B_t      y_t = state_t C_t (+ D X_t)
        out = y W_out

    Position always comes from the cumulative decay ``exp(Δ A)`` (a_t), and from two optional sources:
        ``conv=True`` — Mamba-2's depthwise causal Conv1d (kernel ``conv_kernel``, with bias) + SiLU over
                        [X, B, C], with the ``D`` skip ("Conv1d + D" in the papers);
        ``rope=True`` — RoPE on B and C over the state dim, from the context's shared table (the default).
    The papers' variants: ``rope`` (default), ``decay`` (``rope=False``), ``conv`` (``conv=True, rope=False``;
    Mamba-2), ``conv+rope`` (``conv=True``: OTCE's code). ``d_skip`` switches ``D`` on or off
    independently (default: on exactly when there is a conv).

    ``gate=True`` adds Mamba-2's ``z`` branch as Mamba-2 computes it (mamba_ssm ``norm_before_gate=False``,
    Hugging Face ``MambaRMSNormGated``)::

        y ← rms_norm_g(y ⊙ silu(x W_z)) · w        RMS over each of the n_groups groups of d_inner/n_groups

    and, as Falcon-H1 may have it, with ``norm_before_gate=True`` ``y ← (rms_norm_g(y) · w) ⊙ silu(x W_z)``, or with
    ``gate_rms_norm=False`` no norm at all, ``y ← y ⊙ silu(x W_z)``.

    Args:
        d_model: model width.
        n_heads, head_dim: give at most one; ``n_heads · head_dim = expand · d_model`` (or ``d_inner``). Default
            ``head_dim = min(64, expand · d_model)``.
        d_state: state dim ``N`` per head (default 64); even for ``rope``.
        n_groups: groups sharing B and C (default 1); must divide ``n_heads``.
        expand: inner width ``expand · d_model`` (default 1, as the papers' listings; Mamba-2 uses 2).
        d_inner: the inner width itself, in place of ``expand`` (default None: ``expand · d_model``), for a width
            that is no whole multiple of the model's (Nemotron-3-Nano: 4,096 in 2,688).
        chunk_size: chunk length of the scan (default 64).
        conv: the causal convolution over [X, B, C] (default False).
        rope: RoPE on B and C (default True).
        d_skip: the ``D`` skip (default None: on with a conv, off otherwise).
        gate: Mamba-2's gated, grouped RMSNorm on the output (default False, as the papers' listings).
        gate_rms_norm: with ``gate``, the grouped RMSNorm (default True; False: the gate alone, Falcon-H1's
            ``mamba_rms_norm: false``).
        norm_before_gate: with ``gate`` and its norm, normalise ``y`` and then gate it (default False: Mamba-2's order,
            gate then normalise; True: mamba_ssm's ``norm_before_gate=True``).
        norm_eps: epsilon of the gate's RMSNorm (default 1e-6; Mamba-2 uses 1e-5: the model's).
        conv_kernel: width of the causal convolution for ``conv`` (default 4).
        backend: ``auto`` | ``reference`` | ``triton`` for the scan.
        recompute: keep only the mixer's input for the backward and recompute everything between it
            and the output projection there (activation checkpointing; default False). What a layer
            keeps for the backward drops about 12× (d_model 256, expand 2, chunk 64: from 27 KB to 2 KB
            per token) for one more forward of the mixer per step (docs/performance.md). Never when
            decoding or without gradients.

    Before ``conv`` and ``rope``, one string ``positions`` named the sources: checkpoints and recipes that
    give it are upgraded when read (:func:`upgrade_init_args`); a call that gives it is refused with the
    options to write.

    Initialisation as Mamba-2: ``A_log = log U(1, 16)``; ``Δ_bias`` so that ``softplus(Δ_bias)`` is
    log-uniform in ``[1e-3, 1e-1]``; ``D = 1``.
    """

    mixer_slot = "sequence"  # the block slot it fills; a pattern placing it in the other is refused

    def __init__(
        self,
        d_model: int,
        *,
        n_heads: int | None = None,
        head_dim: int | None = None,
        d_state: int = 64,
        n_groups: int = 1,
        expand: int = 1,
        d_inner: int | None = None,
        chunk_size: int = 64,
        conv: bool = False,
        rope: bool = True,
        d_skip: bool | None = None,
        gate: bool = False,
        gate_rms_norm: bool = True,
        norm_before_gate: bool = False,
        norm_eps: float = 1e-6,
        conv_kernel: int = 4,
        backend: str = "auto",
        recompute: bool = False,
        **moved,
    ):
        super().__init__()
        if moved:
            raise TypeError(f"SSD: unexpected argument(s) {sorted(moved)}" if set(moved) != {"positions"} else (
                f"SSD: positions={moved['positions']!r} is now two options: write "
                + ", ".join(f"{k}={v}" for k, v in upgrade_init_args(moved).items())))
        check_backend(backend, "SSD")
        check_positive("SSD", d_model=d_model, d_state=d_state, n_groups=n_groups, expand=expand,
                       chunk_size=chunk_size, conv_kernel=conv_kernel)
        check_flags("SSD", conv=conv, rope=rope, gate=gate, recompute=recompute, gate_rms_norm=gate_rms_norm,
                    norm_before_gate=norm_before_gate, **({} if d_skip is None else {"d_skip": d_skip}))
        if not gate and (not gate_rms_norm or norm_before_gate):
            raise ValueError(f"SSD: gate_rms_norm={gate_rms_norm} and norm_before_gate={norm_before_gate} shape the "
                             "gate's norm: give them with gate=True")
        if norm_before_gate and not gate_rms_norm:
            raise ValueError("SSD: norm_before_gate=True orders a norm that gate_rms_norm=False leaves out")
        if d_inner is None:
            d_inner, width = expand * d_model, "expand·d_model" if expand != 1 else "d_model"
        else:
            check_positive("SSD", d_inner=d_inner)
            if expand != 1:
                raise ValueError(f"SSD: give expand={expand} or d_inner={d_inner}, not both")
            width = "d_inner"
        if n_heads is not None and head_dim is not None:
            raise ValueError(f"SSD: give n_heads={n_heads} or head_dim={head_dim}, not both")
        if n_heads is None:
            head_dim = min(64, d_inner) if head_dim is None else head_dim
            check_positive("SSD", head_dim=head_dim)
            check_divisible("SSD", "expand·d_model" if width == "d_model" else width, d_inner, "head_dim", head_dim)
            n_heads = d_inner // head_dim
        check_positive("SSD", n_heads=n_heads)
        check_divisible("SSD", width, d_inner, "n_heads", n_heads)
        check_divisible("SSD", "n_heads", n_heads, "n_groups", n_groups)
        if rope and d_state % 2 != 0:
            raise ValueError(f"SSD: d_state={d_state} must be even for rope=True (RoPE rotates pairs)")
        self.n_heads, self.head_dim, self.d_state, self.n_groups = n_heads, d_inner // n_heads, d_state, n_groups
        self.d_model, self.d_inner, self.chunk_size, self.backend = d_model, d_inner, chunk_size, backend
        self.recompute = recompute

        # One fused input projection: [X | B | C | Δ | z].
        self.d_xbc = d_inner + 2 * n_groups * d_state
        self.in_proj = nn.Linear(d_model, self.d_xbc + n_heads + (d_inner if gate else 0), bias=False)
        self.conv = (
            nn.Conv1d(self.d_xbc, self.d_xbc, conv_kernel, groups=self.d_xbc)  # weights only: see _causal_conv
            if conv else None
        )
        self.rope = rope
        self.A_log = nn.Parameter(torch.empty(n_heads).uniform_(1, 16).log())
        dt = torch.exp(torch.empty(n_heads).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        d_skip = self.conv is not None if d_skip is None else d_skip
        self.D = nn.Parameter(torch.ones(n_heads)) if d_skip else None
        self.gate, self.norm_before_gate = gate, norm_before_gate
        self.gate_norm = GroupedRMSNorm(d_inner, n_groups, eps=norm_eps) if gate and gate_rms_norm else None
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    upgrade_init_args = staticmethod(upgrade_init_args)

    @property
    def gate_rms_norm(self) -> bool:
        """Whether the gate has its grouped RMSNorm (``gate_rms_norm``; False without a gate)."""
        return self.gate_norm is not None

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, self.in_proj.weight, sequence=True)
        context = Context.for_input(type(self).__name__, x, context)
        if self.recompute and torch.is_grad_enabled() and context.cache is None:
            return checkpoint(self._mix, x, context, use_reentrant=False)
        return self._mix(x, context)

    def _mix(self, x: torch.Tensor, context: Context) -> torch.Tensor:
        x = context.zero_padding(x)  # padding puts nothing into the state (nor NaN, whatever it holds)
        batch, T, _ = x.shape
        H, P, G, N = self.n_heads, self.head_dim, self.n_groups, self.d_state
        proj = self.in_proj(x)  # [b, T, d_xbc + H (+ d_inner)]
        xbc, dt, z = proj.split([self.d_xbc, H, proj.shape[-1] - self.d_xbc - H], dim=-1)
        cached = context.cache.state(self) if context.cache is not None else None  # decoding: conv window, state
        if self.conv is not None:
            xbc = F.silu(self._causal_conv(xbc, context.cache, context.document_ids))  # [b, T, d_xbc]
        xs, BC = xbc.split([self.d_inner, 2 * G * N], dim=-1)
        xs = xs.view(batch, T, H, P)  # [b, T, H, P]
        BC = BC.view(batch, T, 2 * G, N)  # [b, T, 2G, N]: B's groups, then C's
        if self.rope:  # B and C side by side: one rotation's ops for both, not two (a decoding step's launches)
            cos, sin = context.rotary_tables(N)  # [b, T, N]
            BC = apply_rotary(BC, cos, sin)
        B, C = BC.split(G, dim=2)  # [b, T, G, N] each
        dt = F.softplus(dt + self.dt_bias)  # [b, T, H]
        if context.padding_mask is not None:  # and no decay: dt = 0 (x = 0 already leaves xbc and the conv window 0)
            dt = dt.masked_fill(context.padding_mask[..., None], 0.0)
        A = -torch.exp(at_least_fp32(self.A_log))  # [H]
        if cached is None:
            y = ssd_scan(xs, dt, A, B, C, chunk_size=self.chunk_size, D=self.D, backend=self.backend,
                         document_starts=context.document_starts)
        elif T == 1 and "state" in cached:  # a decoding step: one token of the recurrence
            y, state = ssd_step(cached["state"], xs[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], self.D)
            y = y[:, None].to(xs.dtype)  # [b, 1, H, P]
        else:  # prefill, or several new tokens: the chunked scan from the cached state
            y, state = ssd_scan(xs, dt, A, B, C, chunk_size=self.chunk_size, D=self.D,
                                initial_state=cached.get("state"), return_final_state=True, backend=self.backend)
        if cached is not None:
            context.cache.keep(self, "state", state, T)
        y = y.reshape(batch, T, self.d_inner)  # [b, T, d_inner]
        if self.gate_norm is not None and not self.norm_before_gate:
            y = self.gate_norm(y, gate=z)
        elif self.gate:  # Falcon-H1's forms: normalised first (fp32 in and out) or not at all, then gated, in fp32
            y32 = at_least_fp32(y) if self.gate_norm is None else self.gate_norm(at_least_fp32(y))
            y = (y32 * F.silu(at_least_fp32(z))).to(y.dtype)
        return self.out_proj(y)

    def _causal_conv(self, xbc: torch.Tensor, cache: InferenceCache | None,
                     document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The depthwise causal conv of ``xbc [b, T, C]`` (:func:`~components.sequence.causal_conv.causal_conv`)."""
        return causal_conv(self, self.conv, xbc, cache, document_ids)

    @property
    def rotary_dim(self) -> int | None:
        """The dimension of the rotary table this module reads (None: no RoPE on B and C)."""
        return self.d_state if self.rope else None

    def fused_row_blocks(self) -> dict[str, tuple[int, ...]]:
        """``in_proj`` fuses five projections along its rows: ``[X | B | C | Δ | z]`` (``z`` with ``gate``)."""
        G, N = self.n_groups, self.d_state
        gate = (self.d_inner,) if self.gate else ()
        return {"in_proj.weight": (self.d_inner, G * N, G * N, self.n_heads, *gate)}

    def extra_flops_per_token(self, seq_len: int) -> float:
        """The chunked scan's products beyond the projections and the conv (:mod:`components.flops`), at the chunk
        length it runs with: ``chunk_size`` in the Triton kernel (CUDA), at most ``REFERENCE_CHUNK`` in plain torch."""
        triton = self.in_proj.weight.is_cuda and self.backend != "reference"
        chunk = self.chunk_size if triton else min(self.chunk_size, REFERENCE_CHUNK)
        return ssd_flops_per_token(seq_len, chunk, self.n_heads, self.n_groups, self.head_dim, self.d_state)

    def extra_repr(self) -> str:
        return (f"conv={self.conv is not None}, rope={self.rope}, n_heads={self.n_heads}, head_dim={self.head_dim}, "
                f"d_state={self.d_state}, n_groups={self.n_groups}, chunk_size={self.chunk_size}, "
                f"d_skip={self.D is not None}, gate={self.gate}"
                + (", gate_rms_norm=False" if self.gate and not self.gate_rms_norm else "")
                + (", norm_before_gate=True" if self.norm_before_gate else "")
                + (", recompute=True" if self.recompute else ""))
