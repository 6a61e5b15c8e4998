"""components.flops: the analytic forward FLOPs per token, checked against torch's FlopCounterMode (which counts
the matrix products the reference implementations actually run) for every mixer of the catalogue and for a
whole model, and against PaLM's closed form for a Llama."""

from functools import partial

import pytest
import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

import zoo_kernels.grouped_matmul
from components import SSD, Context, GatedDeltaNet, HybridLM, QCAttention, RoutedMoE
from components.catalogue import SEQUENCE_MIXERS, STATE_MIXERS
from components.flops import forward_flops_per_token

B, T = 2, 37  # odd, not a multiple of the SSD chunks

# torch's counter knows the CUDA SDPA kernels, not the CPU one: count it the same way (4·B·H·T·S·D).
_CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
if _CPU_SDPA.default not in flop_counter.flop_registry:
    flop_counter.register_flop_formula(_CPU_SDPA)(
        lambda q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_flop_count(q, k, v))


def counted(module, x, sequence: bool) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(x, Context.default(x)) if sequence else module(x)
    return counter.get_total_flops()


@pytest.fixture
def unpadded_grouped_matmul(monkeypatch):
    """The fused grouped matmul pads K and N to 16 bytes (work the model does not ask for); the loop of
    matmuls does exactly the model's products."""
    monkeypatch.setattr(zoo_kernels.grouped_matmul, "fused_available", lambda x: False)


@pytest.mark.parametrize("name", [*SEQUENCE_MIXERS, *STATE_MIXERS])
def test_every_mixer_counts_the_products_its_reference_runs(name, unpadded_grouped_matmul):
    torch.manual_seed(0)
    sequence = name in SEQUENCE_MIXERS
    mixer = (SEQUENCE_MIXERS if sequence else STATE_MIXERS)[name](32)
    x = torch.randn(B, T, 32)
    want = forward_flops_per_token(mixer, T) * B * T
    got = counted(mixer, x, sequence)
    # On a CPU the SSD's depthwise causal conv runs as K multiply-adds (components/sequence/ssd.py), which the
    # counter does not see; the analytic count keeps its 2·K·C per token, as a GPU's conv call does them
    convs = [m for m in mixer.modules() if isinstance(m, torch.nn.Conv1d)]
    want -= sum(2 * m.kernel_size[0] * m.out_channels for m in convs) * B * T
    allowed = {want}
    if name.startswith("IFA"):
        # A per-key bias rides SDPA as one more head channel (zoo_kernels/attention/sdpa.py): 4·B·H·T² more.
        allowed.add(want + 4 * B * mixer.n_heads * T * T)
    for windowed in [m for m in mixer.modules() if getattr(m, "sliding_window", None)]:  # (alone or in ParallelMixers)
        # The reference takes the queries in blocks of w, each against 2w keys (its block and the one before, the last
        # block padded to w rows); the count is of the window's w keys per token.
        w, per_key = windowed.sliding_window, 4 * B * windowed.n_heads * windowed.head_dim
        allowed = {a - per_key * T * w + per_key * -(-T // w) * w * 2 * w for a in allowed}
    for rule in [m for m in mixer.modules() if isinstance(m, GatedDeltaNet)]:
        # The unit-triangular solve of each chunk is no matrix product to the counter; the count keeps its L (L - 1) FLOPs
        # per right-hand column.
        L = min(rule.chunk_size, 64)
        allowed = {a - B * -(-T // L) * L * (L - 1) * (rule.v_head_dim + rule.head_dim) * rule.n_heads for a in allowed}
    if name.startswith("CDMoE"):
        # The experts' output rows are mixed by embedding_bag, which the counter does not see: 2·H·k·d per token.
        allowed = {want - 2 * mixer.n_heads * mixer.top_k * mixer.d_model * B * T}
    assert got in {round(a) for a in allowed}, f"{name}: counted {got:,}, analytic {want:,.0f}"


def test_a_hybrid_model_counts_as_its_blocks_and_head(unpadded_grouped_matmul):
    torch.manual_seed(0)
    model = HybridLM(97, 32, "SM AR S-", {"S": partial(SSD, head_dim=8, d_state=8, chunk_size=8),
                                          "A": partial(QCAttention, n_heads=4),
                                          "R": partial(RoutedMoE, n_experts=4, top_k=2, d_ff=12)})
    ids = torch.randint(0, 97, (B, T))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    assert counter.get_total_flops() == round(forward_flops_per_token(model, T) * B * T)


def test_an_ssd_with_a_long_chunk_counts_the_chunks_the_plain_torch_scan_runs():
    """Chunks of 256 (Mamba-2's) run as chunks of 64 in plain torch (zoo_kernels.ssd.REFERENCE_CHUNK): the count
    follows, and is what torch's counter sees at a length of 150 (three chunks of 64, not one of 256)."""
    torch.manual_seed(0)
    ssd = SSD(32, head_dim=8, d_state=8, chunk_size=256)
    x = torch.randn(1, 150, 32)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        ssd(x, Context.default(x))
    assert counter.get_total_flops() == round(forward_flops_per_token(ssd, 150) * 150)


def test_a_llama_has_palms_closed_form():
    """PaLM (appendix B): a dense decoder's forward is 2·N (N the non-embedding parameters, the head included)
    plus 4·L·T·d for attention per token."""
    L, d, V = 3, 64, 101
    model = HybridLM(V, d, f"AM×{L}", {"A": partial(QCAttention, n_heads=4)})
    matrices = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and name != "embedding.weight")
    for seq_len in (1, 64, 1000):
        assert forward_flops_per_token(model, seq_len) == 2 * matrices + 4 * L * seq_len * d


def test_ssd_flops_grow_linearly_with_the_length_and_attention_quadratically():
    ssd, attention = SSD(64, head_dim=16, d_state=16, chunk_size=64), QCAttention(64, n_heads=4)
    ssd_ratio = forward_flops_per_token(ssd, 64 * 64) / forward_flops_per_token(ssd, 64 * 8)
    attention_ratio = forward_flops_per_token(attention, 4096) / forward_flops_per_token(attention, 512)
    assert ssd_ratio < 1.1 and attention_ratio > 4


@pytest.mark.parametrize("seq_len", [0, -3, 2.5])
def test_a_bad_length_is_named(seq_len):
    with pytest.raises(ValueError, match="seq_len"):
        forward_flops_per_token(QCAttention(32, n_heads=4), seq_len)
