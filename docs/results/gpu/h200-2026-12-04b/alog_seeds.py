"""Spread of the fp16-autocast rule's ratios over seeds: kernels' error / references' error per parameter."""
import sys
from functools import partial
import torch
from components import MLP, SSD, CDMoE, HybridLM, InnerFuncAttention, QCAttention
import components.state.cdmoe as cdmoe
picked, forced = [], []
_topk = cdmoe.product_key_topk
def routed(a, b, k):
    scores, experts = _topk(a, b, k)
    picked.append(experts)
    if forced:
        experts, n_b = forced[0], b.shape[-1]
        scores = a.gather(-1, experts // n_b) + b.gather(-1, experts % n_b)
    return scores, experts
cdmoe.product_key_topk = routed
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF = torch.float16

def model(backend, seed):
    torch.manual_seed(seed)
    return HybridLM(97, 64, "SM AC IM", {
        "C": partial(CDMoE, n_experts=64, n_heads=2, top_k=4, key_dim=8, backend=backend),
        "S": partial(SSD, head_dim=16, d_state=16, chunk_size=16, rope=True, backend=backend), "M": MLP,
        "A": partial(QCAttention, n_heads=4, backend=backend),
        "I": partial(InnerFuncAttention, n_heads=4, mask="cheems", backend=backend)}, max_seq_len=64).to(DEVICE)

def loss_and_grads(net, tokens, autocast):
    with torch.autocast(DEVICE, dtype=HALF, enabled=autocast):
        logits = net(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    grads = torch.autograd.grad(loss, list(net.parameters()))
    return [loss.detach().float(), *(g.float() for g in grads)]

import json
dump = []
for seed in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    tokens = torch.randint(0, 97, (2, 37), generator=torch.Generator().manual_seed(3 + seed)).to(DEVICE)
    picked.clear(); forced.clear()
    exact = loss_and_grads(model("reference", seed), tokens, False)
    forced.append(picked[0])
    kernel = loss_and_grads(model("triton", seed), tokens, True)
    half = loss_and_grads(model("reference", seed), tokens, True)
    names = ["loss", *(n for n, _ in model("reference", seed).named_parameters())]
    rows = []
    for name, got, base, want in zip(names, kernel, half, exact):
        if name.endswith(("state_mixer.up", "state_mixer.down")):
            continue
        err, err_t = (got - want).abs().max().item(), (base - want).abs().max().item()
        nerr = ((got - want).norm() / want.norm()).item(); nerr_t = ((base - want).norm() / want.norm()).item()
        rows.append((err / max(err_t, 1e-30), name, err, err_t, nerr / max(nerr_t, 1e-30), want.abs().max().item()))
    dump.append({n: (e, et, m) for r, n, e, et, nr, m in rows})
    rows.sort(reverse=True)
    alog = [r for r in rows if r[1].endswith("A_log")]
    print(f"seed {seed}: worst max-ratio " + "; ".join(f"{n} {r:.2f} ({e:.2g}/{et:.2g}, norm-ratio {nr:.2f}, max|g| {m:.2g})" for r, n, e, et, nr, m in rows[:3]))
    print("   A_log: " + "; ".join(f"{n} {r:.2f} ({e:.2g}/{et:.2g}, norm-ratio {nr:.2f}, max|g| {m:.2g})" for r, n, e, et, nr, m in alog))

json.dump(dump, open(sys.argv[2] if len(sys.argv) > 2 else "alog.json", "w"))
