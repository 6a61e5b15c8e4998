import pytest
import torch
import torch.nn.functional as F

from components import SSD, Context, HybridLM
from components.sequence.ssd import POSITIONS  # the papers' variant names → conv, rope

VARIANTS = ["rope", "decay", "conv"]


def small(positions, **kw):
    return SSD(32, head_dim=8, d_state=8, chunk_size=8, **POSITIONS[positions], **kw)


@pytest.mark.parametrize("positions", VARIANTS)
@pytest.mark.parametrize("gate", [False, True])
def test_ssd_is_causal(assert_causal, positions, gate):
    assert_causal(small(positions, gate=gate), torch.randn(2, 19, 32), cut_points=(0, 7, 8, None))


def test_rope_ssd_depends_on_relative_position_only():
    mixer = small("rope")
    x = torch.randn(2, 21, 32)
    base = mixer(x, Context(position_ids=torch.arange(21).expand(2, 21)))
    shifted = mixer(x, Context(position_ids=torch.arange(21).expand(2, 21) + 1000))
    torch.testing.assert_close(shifted, base, atol=1e-4, rtol=1e-4)
    # ...and does use positions: scrambled ids change the output.
    scrambled = mixer(x, Context(position_ids=torch.randperm(21).expand(2, 21)))
    assert not torch.allclose(scrambled, base, atol=1e-3)


@pytest.mark.parametrize("positions", ["decay", "conv"])
def test_conv_and_decay_ignore_position_ids(positions):
    mixer = small(positions)
    x = torch.randn(2, 13, 32)
    base = mixer(x)
    other = mixer(x, Context(position_ids=torch.randint(0, 500, (2, 13))))
    torch.testing.assert_close(other, base, rtol=0, atol=0)


@pytest.mark.parametrize("positions", VARIANTS)
def test_left_padding_does_not_reach_real_tokens(positions):
    mixer = small(positions)
    x = torch.randn(1, 12, 32)
    padding = torch.zeros(1, 12, dtype=torch.bool)
    padding[0, :4] = True
    ctx = Context(position_ids=torch.arange(12)[None], padding_mask=padding)
    y = mixer(x, ctx)
    x2 = x.clone()
    x2[0, :4] = 10 * torch.randn(4, 32)
    torch.testing.assert_close(mixer(x2, ctx)[0, 4:], y[0, 4:])


def test_module_matches_its_math_written_out():
    # The decay variant end to end through the recurrence, from the module's own weights.
    mixer = SSD(16, head_dim=4, d_state=6, n_groups=2, chunk_size=4, rope=False)
    x = torch.randn(1, 9, 16)
    H, P, G, N = 4, 4, 2, 6
    proj = x @ mixer.in_proj.weight.T
    xs, B, C, dt = proj.split([16, G * N, G * N, H], dim=-1)
    dt = F.softplus(dt + mixer.dt_bias)
    A = -torch.exp(mixer.A_log)
    state = torch.zeros(1, H, P, N)
    ys = []
    for t in range(9):
        for h in range(H):
            g = h // (H // G)
            b_t = B[0, t].view(G, N)[g]
            x_t = xs[0, t].view(H, P)[h]
            state[0, h] = torch.exp(dt[0, t, h] * A[h]) * state[0, h] + dt[0, t, h] * torch.outer(x_t, b_t)
        ys.append(torch.stack([state[0, h] @ C[0, t].view(G, N)[h // 2] for h in range(H)]).reshape(-1))
    want = torch.stack(ys)[None] @ mixer.out_proj.weight.T
    torch.testing.assert_close(mixer(x), want, atol=1e-5, rtol=1e-4)


def test_mamba2_initialisation():
    mixer = SSD(256, head_dim=4, conv=True, rope=False)
    A = -torch.exp(mixer.A_log)
    assert (A <= -1).all() and (A >= -16).all()
    dt = F.softplus(mixer.dt_bias)
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 1e-1 * 1.001).all()
    assert dt.min() < 1e-2 < dt.max()  # spread over the range, not a constant
    torch.testing.assert_close(mixer.D, torch.ones_like(mixer.D))
    assert small("rope").D is None and small("decay").D is None and small("rope").conv is None


def test_chunk_size_does_not_change_the_result():
    a, b = small("rope"), SSD(32, head_dim=8, d_state=8, chunk_size=64, rope=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 50, 32)
    torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=1e-5)


def test_s_is_bound_to_ssd_by_default():
    model = HybridLM(vocab_size=16, d_model=32, pattern="SM S-")
    assert type(model.blocks[0].sequence_mixer).__name__ == "SSD"
    ssd = model.blocks[0].sequence_mixer
    assert ssd.rope and ssd.conv is None


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(d_state=7, rope=True), "d_state=7 must be even for rope=True"),
        (dict(n_heads=3), "SSD: d_model=32 is not divisible by n_heads=3"),
        (dict(n_heads=3, expand=2), "SSD: expand·d_model=64 is not divisible by n_heads=3"),
        (dict(head_dim=5), "expand·d_model=32 is not divisible by head_dim=5"),
        (dict(n_heads=4, n_groups=3), "n_heads=4 is not divisible by n_groups=3"),
        (dict(n_heads=4, head_dim=8), "give n_heads=4 or head_dim=8, not both"),
        (dict(d_inner=40, expand=2), "SSD: give expand=2 or d_inner=40, not both"),
        (dict(d_inner=40, head_dim=16), "SSD: d_inner=40 is not divisible by head_dim=16"),
        (dict(d_inner=40, n_heads=3), "SSD: d_inner=40 is not divisible by n_heads=3"),
        (dict(d_inner=0), "SSD: d_inner=0 must be a positive integer"),
        (dict(gate_rms_norm=False), "SSD: gate_rms_norm=False and norm_before_gate=False shape the gate's norm: give "
                                    "them with gate=True"),
        (dict(norm_before_gate=True), "give them with gate=True"),
        (dict(gate=True, gate_rms_norm=False, norm_before_gate=True),
         "SSD: norm_before_gate=True orders a norm that gate_rms_norm=False leaves out"),
        (dict(gate=True, norm_before_gate=1), "norm_before_gate"),
    ],
)
def test_bad_configuration_names_the_problem(kwargs, words):
    with pytest.raises(ValueError) as info:
        SSD(32, **kwargs)
    assert words in str(info.value)


def test_an_inner_width_of_its_own_sizes_the_heads_and_projections():
    """``d_inner`` in place of ``expand``: 40 channels in a width of 32 (Nemotron-3-Nano's 4,096 in 2,688, small)."""
    ssd = SSD(32, d_inner=40, head_dim=8, d_state=4, n_groups=1, conv=True, rope=False, gate=True)
    assert (ssd.d_inner, ssd.n_heads, ssd.head_dim) == (40, 5, 8)
    assert ssd.in_proj.weight.shape == (2 * 40 + 2 * 4 + 5, 32) and ssd.out_proj.weight.shape == (32, 40)
    assert SSD(32, expand=2).d_inner == SSD(32, d_inner=64).d_inner == 64


def test_odd_d_state_is_fine_without_rope():
    assert SSD(32, d_state=7, rope=False)(torch.randn(1, 5, 32)).shape == (1, 5, 32)


GATES = {"norm_after": {"gate": True}, "norm_before": {"gate": True, "norm_before_gate": True},
         "no_norm": {"gate": True, "gate_rms_norm": False}, None: {}}  # the gate's forms (Mamba-2's, Falcon-H1's two)


@pytest.mark.parametrize("positions, d_skip, gate", [
    ("conv+rope", None, "norm_after"), ("conv", False, "norm_after"), ("rope", True, None), ("decay", None, "norm_after"),
    ("conv", None, "norm_before"), ("conv", None, "no_norm"),
])
def test_every_variant_matches_its_math_written_out(rope_reference, positions, d_skip, gate):
    torch.manual_seed(1)
    H, P, G, N, K, T = 4, 3, 2, 6, 3, 7
    mixer = SSD(12, n_heads=H, d_state=N, n_groups=G, chunk_size=4, **POSITIONS[positions], d_skip=d_skip,
                **GATES[gate], conv_kernel=K, norm_eps=1e-5)
    assert (mixer.gate_norm is not None) == (gate in ("norm_after", "norm_before"))
    with torch.no_grad():
        for p in (mixer.D, mixer.gate_norm.weight if mixer.gate_norm is not None else None):
            if p is not None:
                p.uniform_(0.5, 1.5)  # not 1, so a missing D or gain shows
    x = torch.randn(1, T, 12, dtype=torch.float64)
    mixer.double()
    proj = x[0] @ mixer.in_proj.weight.T  # [T, ...]
    xbc, dt, z = proj[:, :12 + 2 * G * N], proj[:, 12 + 2 * G * N:12 + 2 * G * N + H], proj[:, 12 + 2 * G * N + H:]
    if "conv" in positions:
        w, bias = mixer.conv.weight[:, 0], mixer.conv.bias  # [C, K], [C]
        conv = torch.stack([bias + sum(w[:, K - 1 - j] * xbc[t - j] for j in range(K) if t - j >= 0) for t in range(T)])
        xbc = conv * torch.sigmoid(conv)
    xs, B, C = xbc[:, :12].view(T, H, P), xbc[:, 12:12 + G * N].view(T, G, N), xbc[:, 12 + G * N:].view(T, G, N)
    if "rope" in positions:
        B = torch.stack([torch.stack([rope_reference(B[t, g], t) for g in range(G)]) for t in range(T)])
        C = torch.stack([torch.stack([rope_reference(C[t, g], t) for g in range(G)]) for t in range(T)])
    dt = F.softplus(dt + mixer.dt_bias)
    A = -torch.exp(mixer.A_log)
    state = torch.zeros(H, P, N, dtype=torch.float64)
    ys = []
    for t in range(T):
        y_t = []
        for h in range(H):
            g = h // (H // G)
            state[h] = torch.exp(dt[t, h] * A[h]) * state[h] + dt[t, h] * torch.outer(xs[t, h], B[t, g])
            y_t.append(state[h] @ C[t, g] + (mixer.D[h] * xs[t, h] if mixer.D is not None else 0))
        ys.append(torch.cat(y_t))
    y = torch.stack(ys)  # [T, H·P]
    def rms_norm(u):  # RMS per group, then the gain
        u = u.view(T, G, -1)
        return (u / torch.sqrt(u.pow(2).mean(-1, keepdim=True) + 1e-5)).reshape(T, -1) * mixer.gate_norm.weight
    if gate == "norm_after":
        y = rms_norm(y * z * torch.sigmoid(z))  # y ⊙ silu(z), then normalised
    elif gate == "norm_before":
        y = rms_norm(y) * z * torch.sigmoid(z)
    elif gate == "no_norm":
        y = y * z * torch.sigmoid(z)
    want = y @ mixer.out_proj.weight.T
    torch.testing.assert_close(mixer(x)[0], want, rtol=1e-6, atol=1e-9)  # (RoPE tables are fp32)
    assert (mixer.D is not None) == (d_skip if d_skip is not None else "conv" in positions)


@pytest.mark.parametrize("T", [1, 2, 19])
def test_the_causal_conv_on_a_cpu_is_torch_conv1d_outputs_and_gradients(T):
    """On a CPU the conv runs as K multiply-adds over [b, T, C] (a GPU calls conv1d): against conv1d itself, with
    every gradient, in float64, at T shorter than the kernel too; its output is contiguous for what follows."""
    torch.manual_seed(2)
    mixer = SSD(32, head_dim=8, d_state=8, conv=True, rope=False, conv_kernel=4).double()
    xbc = torch.randn(2, T, mixer.d_xbc, dtype=torch.float64, requires_grad=True)
    got = mixer._causal_conv(xbc, None)
    want = F.conv1d(F.pad(xbc, (0, 0, 3, 0)).transpose(1, 2), mixer.conv.weight, mixer.conv.bias,
                    groups=mixer.d_xbc).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert got.is_contiguous()
    cotangent = torch.randn_like(got)
    params = [xbc, mixer.conv.weight, mixer.conv.bias]
    for g, w in zip(torch.autograd.grad(got, params, cotangent), torch.autograd.grad(want, params, cotangent)):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("positions", [*VARIANTS, "conv+rope"])
def test_left_padded_sequence_equals_the_sequence_alone(positions):
    # With a conv the padded positions' conv output is silu(bias) ≠ 0, so only dt = 0 there keeps the
    # state empty until the first real token.
    mixer = small(positions, gate=True)
    with torch.no_grad():
        mixer.conv.bias.uniform_(0.5, 1.0) if mixer.conv is not None else None
    real = torch.randn(1, 9, 32)
    alone = mixer(real)
    padded = torch.cat([torch.randn(1, 4, 32), real], dim=1)  # [1, 13, 32]
    padding = torch.arange(13)[None] < 4
    ctx = Context(position_ids=(torch.arange(13)[None] - 4).clamp_min(0), padding_mask=padding)
    torch.testing.assert_close(mixer(padded, ctx)[:, 4:], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("positions", ["conv", "conv+rope"])
def test_recompute_gives_the_same_outputs_and_gradients_and_keeps_only_the_input(positions):
    """``recompute=True`` (activation checkpointing) changes what the backward keeps, nothing it computes."""
    mask = torch.zeros(2, 23, dtype=torch.bool)
    mask[1, :5] = True
    context = Context(position_ids=(torch.cumsum(~mask, 1) - 1).clamp_min(0), padding_mask=mask)
    x = torch.randn(2, 23, 32)
    results = {}
    for recompute in (False, True):
        torch.manual_seed(0)
        ssd = SSD(32, **POSITIONS[positions], expand=2, head_dim=8, d_state=8, chunk_size=8, gate=True, recompute=recompute)
        xr = x.clone().requires_grad_()
        kept = {}

        def pack(t):
            if not isinstance(t, torch.nn.Parameter):
                kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = ssd(xr, context)
        y.square().sum().backward()
        results[recompute] = (y.detach(), xr.grad, {n: p.grad for n, p in ssd.named_parameters()}, sum(kept.values()))
    (y0, dx0, g0, kept0), (y1, dx1, g1, kept1) = results[False], results[True]
    torch.testing.assert_close(y1, y0, rtol=0, atol=0)
    torch.testing.assert_close(dx1, dx0, rtol=1e-6, atol=1e-7)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-6, atol=1e-7, msg=name)
    assert kept1 <= x.numel() * 4 + 1024 < kept0 / 10  # the input (and the small context), against everything


def test_recompute_is_off_when_decoding():
    ssd = SSD(32, head_dim=8, d_state=8, chunk_size=4, conv=True, rope=False, recompute=True)
    model = HybridLM(61, 32, "S-", {"S": lambda d: ssd})
    ids = torch.randint(0, 61, (2, 9))
    full = model(ids)
    cache = model.new_cache(2, 9)
    steps = [model(ids[:, :5], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_the_positions_string_of_old_recipes_and_checkpoints_reads_as_the_two_options():
    for name, options in POSITIONS.items():
        old = {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "positions": name}}
        ssd = HybridLM(16, 32, "S-", {"S": old}).blocks[0].sequence_mixer
        assert (ssd.conv is not None, ssd.rope) == (options["conv"], options["rope"])
        assert HybridLM(16, 32, "S-", {"S": old}).binding_specs()["S"]["init_args"] == {"head_dim": 8, "d_state": 8, **options}
    with pytest.raises(ValueError, match="positions='alibi' is not one of \\('rope', 'decay', 'conv', 'conv\\+rope'\\)"):
        HybridLM(16, 32, "S-", {"S": {"class_path": "components.SSD", "init_args": {"positions": "alibi"}}})
    with pytest.raises(TypeError, match="positions='conv' is now two options: write conv=True, rope=False"):
        SSD(32, positions="conv")
    # an SSD inside InnerFuncAttention, recorded with its positions, too
    from components import InnerFuncAttention

    old_ifa = {"class_path": "components.InnerFuncAttention", "init_args": {"n_heads": 4, "inner": "ssd",
                                                                            "ssd": {"d_state": 8, "positions": "conv"}}}
    value = HybridLM(16, 32, "I-", {"I": old_ifa}).blocks[0].sequence_mixer.value
    assert isinstance(value, SSD) and value.conv is not None and not value.rope
    assert isinstance(InnerFuncAttention(32, n_heads=4, inner={"ssd": {"d_state": 8, "conv": True}}).value.conv, torch.nn.Conv1d)
