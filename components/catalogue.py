"""Every mixer the zoo exports, in small configurations covering its variants: what the contract tests
run over (decoding = full forward, packed documents, padding, causality with non-finite inputs, no host
sync and a whole-graph compile, bad input). Each entry is a factory ``d_model -> nn.Module`` for
``d_model = 32``. A mixer exported by :mod:`components` with no entry here fails
``tests/components/test_catalogue.py``; adding one entry puts a new mixer through every contract test
(docs/architecture.md, "Adding a mixer")."""

from functools import partial

from components.sequence import SSD, Expresser, GatedDeltaNet, InnerFuncAttention, ParallelMixers, QCAttention, ShortConv, TokenShift
from components.state import MLP, CDMoE, CohesiveMoE, ComposedMoE, ExpansiveMoE, RoutedMoE, SharedExpertMoE

SEQUENCE_MIXERS = {
    "QCAttention": partial(QCAttention, n_heads=4, n_kv_heads=2),
    "QCAttention no RoPE, QK-norm": partial(QCAttention, n_heads=4, rope=False, qk_norm=True),
    "QCAttention heads of 12, half RoPE, QK-norm, QKV bias": partial(QCAttention, n_heads=4, n_kv_heads=2, head_dim=12,
                                                                     rope_fraction=0.5, qk_norm=True, qkv_bias=True),
    "QCAttention, sliding window 5": partial(QCAttention, n_heads=4, n_kv_heads=2, sliding_window=5),
    "QCAttention, output gate, heads of 6 (Qwen3-Next's)": partial(QCAttention, n_heads=4, n_kv_heads=2, head_dim=6,
                                                                 output_gate=True, qk_norm=True, rope_fraction=1 / 3),
    "QCAttention, QK-norm over all heads, no RoPE (OLMo-Hybrid's)": partial(QCAttention, n_heads=4, n_kv_heads=2,
                                                                             rope=False, qk_norm=True,
                                                                             qk_norm_over="all_heads"),
    "IFA content": partial(InnerFuncAttention, n_heads=4, n_kv_heads=2, mask="content"),
    "IFA content_exp, window 5": partial(InnerFuncAttention, n_heads=4, n_kv_heads=2, mask="content_exp", keep_window=5,
                                         qk_norm=True),
    "IFA cheems": partial(InnerFuncAttention, n_heads=4, n_kv_heads=2, mask="cheems"),
    "IFA position": partial(InnerFuncAttention, n_heads=4, mask={"position": {"max_position": 64}}),
    "IFA retrieval, window 3": partial(InnerFuncAttention, n_heads=4, inner="retrieval", keep_window=3),
    "IFA ssd value": partial(InnerFuncAttention, n_heads=4, inner={"ssd": {"d_state": 8, "chunk_size": 4,
                                                                                    "conv": True, "rope": False}}),
    "SSD rope": partial(SSD, head_dim=8, d_state=8, chunk_size=4),
    "SSD decay": partial(SSD, head_dim=8, d_state=8, chunk_size=4, rope=False),
    "SSD conv+rope, gate, 2 groups": partial(SSD, head_dim=8, d_state=8, n_groups=2, chunk_size=4, conv=True, rope=True,
                                             gate=True),
    "SSD conv, gate, d_inner 40": partial(SSD, d_inner=40, head_dim=8, d_state=8, chunk_size=4, conv=True, rope=False,
                                          gate=True),
    "SSD conv, gate, recompute": partial(SSD, head_dim=8, d_state=8, chunk_size=4, conv=True, rope=False, gate=True, recompute=True),
    "SSD conv, gate after its norm": partial(SSD, head_dim=8, d_state=8, n_groups=2, chunk_size=4, conv=True, rope=False,
                                             gate=True, norm_before_gate=True),
    "SSD conv, gate without norm": partial(SSD, head_dim=8, d_state=8, chunk_size=4, conv=True, rope=False, gate=True,
                                           gate_rms_norm=False),
    "GatedDeltaNet": partial(GatedDeltaNet, head_dim=8, chunk_size=4),
    "GatedDeltaNet, 2 key heads for 4, values 12 wide, no gate, negative eigenvalues": partial(
        GatedDeltaNet, n_heads=4, head_dim=8, n_k_heads=2, v_head_dim=12, gate=False, allow_neg_eigval=True, chunk_size=5),
    "Expresser": partial(Expresser, n_heads=4, n_kv_heads=2),
    "TokenShift": TokenShift,
    "ShortConv": ShortConv,
    "ShortConv, 4 taps, biases": partial(ShortConv, kernel_size=4, bias=True),
    "ParallelMixers: QCAttention + SSD (Falcon-H1)": partial(ParallelMixers, mixers=[
        {"class_path": "components.QCAttention", "init_args": {"n_heads": 4, "n_kv_heads": 2}},
        {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "chunk_size": 4, "conv": True,
                                                       "rope": False, "gate": True, "gate_rms_norm": False}}]),
    "ParallelMixers: windowed attention + ShortConv + SSD rope": partial(ParallelMixers, mixers=[
        {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "sliding_window": 3}},
        {"class_path": "components.ShortConv", "init_args": {}},
        {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "chunk_size": 4}}]),
}

WHOLE_BLOCKS = {"Expresser"}
"""The entries above that are whole blocks (:class:`components.block.WholeBlock`): in a pattern their token
has no state mixer (``"A-"``, not ``"AM"``)."""

STATE_MIXERS = {
    "MLP": MLP,
    "MLP switanh": partial(MLP, activation="switanh"),
    "RoutedMoE": partial(RoutedMoE, n_experts=5, top_k=2, d_ff=10),
    "RoutedMoE top-1": partial(RoutedMoE, n_experts=6, top_k=1, d_ff=8),
    "RoutedMoE normalized, swisig": partial(RoutedMoE, n_experts=4, top_k=3, d_ff=8, activation="swisig", normalize=True),
    "SharedExpertMoE, 2 shared": partial(SharedExpertMoE, n_experts=4, n_shared=2, d_ff=6),
    "CohesiveMoE": partial(CohesiveMoE, n_experts=4, d_ff=10),
    "ExpansiveMoE": partial(ExpansiveMoE, n_experts=4, d_ff=6, d_shared=14),
    "ExpansiveMoE scalar gates": partial(ExpansiveMoE, n_experts=4, d_ff=6, d_shared=14, gate="scalar"),
    "ComposedMoE: router, experts, shared expert": partial(
        ComposedMoE, router={"class_path": "components.TopKRouter", "init_args": {"n_experts": 4, "top_k": 2}},
        experts={"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 4, "d_ff": 6, "activation": "swisig"}},
        shared_expert={"class_path": "components.MLP", "init_args": {"d_ff": 10}}),
    "ComposedMoE: sigmoid router, 2 of 3 groups, plain relu² experts": partial(
        ComposedMoE, router={"class_path": "components.SigmoidRouter",
                             "init_args": {"n_experts": 6, "top_k": 2, "n_groups": 3, "top_groups": 2, "scale": 2.5}},
        experts={"class_path": "components.state.MLPExperts",
                 "init_args": {"n_experts": 6, "d_ff": 6, "activation": "plain", "act": "relu2"}},
        shared_expert={"class_path": "components.MLP", "init_args": {"d_ff": 10, "activation": "plain", "act": "relu2"}}),
    "CDMoE, balance loss": partial(CDMoE, n_experts=64, n_heads=2, top_k=4, key_dim=8, balance_loss=True),
    "CDMoE Doge": partial(CDMoE, n_experts=64, n_heads=1, top_k=4, key_dim=None, shared_mlp="swiglu", cross_domain="parallel"),
}
