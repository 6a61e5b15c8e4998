"""QCAttention and InnerFuncAttention options against their math written out: RoPE on or off, on all of
each head or its first part (partial rotary), QK-norm, GQA, and the two content masks (``A·softplus(δ)`` per query head; Doge's ``exp(A·softplus(δ))``
per key/value head)."""

import math

import pytest
import torch
import torch.nn.functional as F

from components import Context, InnerFuncAttention, QCAttention


def rms_by_hand(v: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return v / torch.sqrt((v * v).mean() + eps) * weight


def attend_by_hand(q, k, v, bias=None, window=None):
    """``q [T,H,D]``, ``k, v [T,Hkv,D]``, ``bias [H,T]`` → ``[T,H,D]``: causal softmax, one query at a time, over
    the keys ``j`` with ``i - j < window`` (transformers' sliding window: the query and the ``window - 1`` before it)."""
    T, H, D = q.shape
    group = H // k.shape[1]
    out = torch.zeros_like(q)
    for h in range(H):
        for i in range(T):
            first = 0 if window is None else max(0, i - window + 1)
            scores = torch.stack([q[i, h] @ k[j, h // group] / math.sqrt(D) + (bias[h, j] if bias is not None else 0)
                                  for j in range(first, i + 1)])
            out[i, h] = torch.softmax(scores, 0) @ v[first: i + 1, h // group]
    return out


def positions_by_hand(q, k, mixer, rope_reference, positions, fraction=1.0):
    """QK-norm with the mixer's gains, then RoPE by hand on the first ``fraction`` of each head (the fraction asked
    for, not the module's record of it)."""
    T = q.shape[0]
    if mixer.positions.q_norm is not None:
        eps = mixer.positions.q_norm.eps
        q = torch.stack([torch.stack([rms_by_hand(q[t, h], mixer.positions.q_norm.weight, eps) for h in range(q.shape[1])]) for t in range(T)])
        k = torch.stack([torch.stack([rms_by_hand(k[t, h], mixer.positions.k_norm.weight, eps) for h in range(k.shape[1])]) for t in range(T)])
    if mixer.positions.rope:
        r = round(q.shape[-1] * fraction)  # the first r channels of a head turn, as a head of r channels; the rest stay

        def turned(v, pos):
            return torch.cat([rope_reference(v[:r], pos), v[r:]])

        q = torch.stack([torch.stack([turned(q[t, h], positions[t]) for h in range(q.shape[1])]) for t in range(T)])
        k = torch.stack([torch.stack([turned(k[t, h], positions[t]) for h in range(k.shape[1])]) for t in range(T)])
    return q, k


@pytest.mark.parametrize("rope, qk_norm, fraction, head_dim", [
    (True, False, 1.0, None), (False, False, 1.0, None), (True, True, 1.0, None), (False, True, 1.0, None),
    (True, False, 0.25, None), (True, True, 0.75, None),
    (True, True, 1.0, 6), (True, False, 0.5, 12)])  # (heads of 6 and 12 channels, decoupled from the width 32, as Qwen3's)
def test_qcattention_matches_its_math_written_out(rope_reference, rope, qk_norm, fraction, head_dim):
    torch.manual_seed(0)
    mixer = QCAttention(32, n_heads=4, n_kv_heads=2, head_dim=head_dim, rope=rope, qk_norm=qk_norm, norm_eps=1e-5,
                        rope_fraction=fraction).double()
    if qk_norm:
        with torch.no_grad():
            mixer.positions.q_norm.weight.uniform_(0.5, 1.5), mixer.positions.k_norm.weight.uniform_(0.5, 1.5)
    T, positions, Dh = 6, [3, 4, 5, 6, 7, 8], head_dim or 8  # positions not starting at 0, so the rotation shows
    x = torch.randn(1, T, 32, dtype=torch.float64)
    q = (x[0] @ mixer.q_proj.weight.T).view(T, 4, Dh)
    k, v = (x[0] @ mixer.kv_proj.weight.T).view(T, 2, 2, Dh).unbind(1)
    q, k = positions_by_hand(q, k, mixer, rope_reference, positions, fraction)
    want = attend_by_hand(q, k, v).reshape(T, 4 * Dh) @ mixer.out_proj.weight.T
    got = mixer(x, Context(position_ids=torch.tensor([positions])))
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-8)  # (RoPE tables are fp32)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_the_output_gate_scales_each_channel_of_each_head_by_its_own_sigmoid(rope_reference, qkv_bias):
    """Gated attention (Qiu et al.; Qwen3-Next's): ``o = (attend(q, k, v) ⊙ σ(x W_g + b_g)) W_o``, channel by channel
    of every head, with QK-norm and RoPE on a third of heads of 6 — written out one query at a time."""
    torch.manual_seed(1)
    mixer = QCAttention(32, n_heads=4, n_kv_heads=2, head_dim=6, qk_norm=True, rope_fraction=1 / 3, norm_eps=1e-5,
                        qkv_bias=qkv_bias, output_gate=True).double()
    T, positions = 7, list(range(7))
    x = torch.randn(1, T, 32, dtype=torch.float64)
    q = F.linear(x[0], mixer.q_proj.weight, mixer.q_proj.bias).view(T, 4, 6)
    k, v = F.linear(x[0], mixer.kv_proj.weight, mixer.kv_proj.bias).view(T, 2, 2, 6).unbind(1)
    q, k = positions_by_hand(q, k, mixer, rope_reference, positions, 1 / 3)
    gate = torch.sigmoid(F.linear(x[0], mixer.gate_proj.weight, mixer.gate_proj.bias))  # [T, H·Dh]
    want = (attend_by_hand(q, k, v).reshape(T, 24) * gate) @ mixer.out_proj.weight.T
    torch.testing.assert_close(mixer(x)[0], want, rtol=1e-5, atol=1e-8)
    assert mixer.gate_proj.weight.shape == (24, 32) and (mixer.gate_proj.bias is not None) == qkv_bias
    assert "output_gate=True" in repr(mixer)


@pytest.mark.parametrize("setting", ["plain", "left padding", "documents", "window 3, gate"])
def test_attention_weights_rebuild_the_forward_output(setting):
    """``QCAttention.attention_weights`` are the weights ``forward`` averages its values with: through them, the
    values, the gate and the output map give ``forward``'s output at every real position (GQA, RoPE on all of each
    head, a QK-norm) — with left padding, packed documents, a sliding window."""
    torch.manual_seed(2)
    window, gate = (3, True) if setting.startswith("window") else (None, False)
    mixer = QCAttention(32, n_heads=4, n_kv_heads=2, qk_norm=True, sliding_window=window, output_gate=gate).double()
    B, T = 2, 11
    x = torch.randn(B, T, 32, dtype=torch.float64)
    padding = torch.zeros(B, T, dtype=torch.bool)
    if setting == "left padding":
        padding[1, :4] = True
    documents = torch.tensor([[0] * 5 + [1] * 6, [0] * 8 + [1] * 3]) if setting == "documents" else None
    context = Context(position_ids=torch.arange(T).expand(B, T), padding_mask=padding if padding.any() else None,
                      document_ids=documents)
    weights = mixer.attention_weights(x, context)  # [B, H, T, T]
    assert weights.shape == (B, 4, T, T)
    x0 = x.masked_fill(padding[..., None], 0.0)
    _, v = F.linear(x0, mixer.kv_proj.weight).view(B, T, 2, 2, 8).unbind(2)  # [B, T, 2, 8]
    y = (weights @ v.repeat_interleave(2, dim=2).transpose(1, 2)).transpose(1, 2).reshape(B, T, 32)
    if gate:
        y = y * torch.sigmoid(mixer.gate_proj(x0))
    real = ~padding
    torch.testing.assert_close(mixer.out_proj(y)[real], mixer(x, context)[real])
    if window:
        assert (weights.tril(-window) == 0).all()


@pytest.mark.parametrize("window", [1, 3, 7, 50])
def test_a_sliding_window_attends_to_the_last_keys_only(rope_reference, window):
    """Each query over itself and the ``window - 1`` keys before it, at an odd length; a window of 1 is the value of
    the token itself, one of the length or more is plain causal attention."""
    torch.manual_seed(0)
    mixer = QCAttention(32, n_heads=4, n_kv_heads=2, sliding_window=window).double()
    T = 7
    x = torch.randn(1, T, 32, dtype=torch.float64)
    q = (x[0] @ mixer.q_proj.weight.T).view(T, 4, 8)
    k, v = (x[0] @ mixer.kv_proj.weight.T).view(T, 2, 2, 8).unbind(1)
    q, k = positions_by_hand(q, k, mixer, rope_reference, list(range(T)))
    want = attend_by_hand(q, k, v, window=window).reshape(T, 32) @ mixer.out_proj.weight.T
    torch.testing.assert_close(mixer(x)[0], want, rtol=1e-5, atol=1e-8)  # (RoPE tables are fp32)
    assert ("sliding_window=" in repr(mixer)) and (mixer.extra_flops_per_token(T) == 4 * min(T, window) * 4 * 8)


@pytest.mark.parametrize("window", [0, -2, 2.0, True, "4"])
def test_a_sliding_window_must_be_a_positive_integer(window):
    with pytest.raises(ValueError, match=f"QCAttention: sliding_window={window!r} must be an integer >= 1"):
        QCAttention(32, n_heads=4, sliding_window=window)


def test_attention_without_rope_ignores_positions():
    mixer = QCAttention(16, n_heads=4, rope=False)
    x = torch.randn(2, 7, 16)
    plain = mixer(x)
    moved = mixer(x, Context(position_ids=torch.randint(0, 1000, (2, 7))))
    torch.testing.assert_close(moved, plain, rtol=0, atol=0)
    assert not torch.allclose(QCAttention(16, n_heads=4)(x, Context(position_ids=torch.randint(0, 1000, (2, 7)))),
                              QCAttention(16, n_heads=4)(x))


@pytest.mark.parametrize("mask, fraction", [("content", 1.0), ("content_exp", 1.0), ("content_exp", 0.5)])
def test_content_masks_match_their_formula(rope_reference, mask, fraction):
    torch.manual_seed(0)
    mixer = InnerFuncAttention(16, n_heads=4, n_kv_heads=2, mask=mask, qk_norm=True, rope_fraction=fraction).double()
    with torch.no_grad():
        mixer.key_bias.A.uniform_(-2, 2)
    T = 7
    x = torch.randn(1, T, 16, dtype=torch.float64)
    q = (x[0] @ mixer.q_proj.weight.T).view(T, 4, 4)
    k = (x[0] @ mixer.k_proj.weight.T).view(T, 2, 4)
    v_flat = x[0] @ mixer.value.weight.T  # [T, Hkv·Dh]
    delta = F.softplus(v_flat @ mixer.key_bias.delta_proj.weight.T)  # [T, 4] per query head, or [T, 2] per kv head
    if mask == "content":
        bias = (mixer.key_bias.A * delta).T  # [H, T]
    else:
        bias = torch.exp(mixer.key_bias.A * delta).T.repeat_interleave(2, dim=0)  # kv head g serves query heads 2g, 2g+1
        assert mixer.key_bias.A.shape == (2,)
    q, k = positions_by_hand(q, k, mixer, rope_reference, list(range(T)), fraction)
    want = attend_by_hand(q, k, v_flat.view(T, 2, 4), bias).reshape(T, 16) @ mixer.out_proj.weight.T
    torch.testing.assert_close(mixer(x)[0], want, rtol=1e-5, atol=1e-8)  # (RoPE tables are fp32)


def test_exp_mask_starts_as_plain_attention():
    torch.manual_seed(0)
    ifa = InnerFuncAttention(16, n_heads=4, n_kv_heads=2, mask="content_exp")
    plain = InnerFuncAttention(16, n_heads=4, n_kv_heads=2, mask="none")
    plain.load_state_dict({k: v for k, v in ifa.state_dict().items() if not k.startswith("key_bias.")})
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(ifa(x), plain(x))  # exp(0) = 1 on every key: a constant shift of the scores
