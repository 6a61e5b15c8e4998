"""Survey of bad inputs: how many get a named error (or work, where working is right), and how many end in
a torch error from deep inside or a silently wrong answer. `python docs/bad_input_survey.py` (docs/training.md)."""
import tempfile
import torch
from components import *
from components.context import Context

def named(fn, owner_words, should_work=False, check=None):
    try:
        out = fn()
    except (Exception, MemoryError, RecursionError) as e:
        msg = str(e)
        ok = (not should_work) and any(w in msg.split(":")[0] or msg.startswith(w) for w in owner_words)
        return "named" if ok else f"deep: {type(e).__name__}: {(msg.splitlines() or [''])[0][:70]}"
    if should_work:
        if check is not None and not check(out):
            return "silent-wrong"
        return "works"
    return "silent"

mixers = {
 "QCAttention": lambda: QCAttention(32, n_heads=4),
 "InnerFuncAttention": lambda: InnerFuncAttention(32, n_heads=4),
 "InnerFuncAttention/ssd": lambda: InnerFuncAttention(32, n_heads=4, inner={"ssd": {"d_state": 8}}),
 "InnerFuncAttention/pos": lambda: InnerFuncAttention(32, n_heads=4, mask="position"),
 "SSD": lambda: SSD(32, d_state=8),
 "SSD/conv": lambda: SSD(32, d_state=8, conv=True, rope=False),
 "MLP": lambda: MLP(32), "RoutedMoE": lambda: RoutedMoE(32, n_experts=4),
 "ExpansiveMoE": lambda: ExpansiveMoE(32, n_experts=4), "CDMoE": lambda: CDMoE(32, n_experts=64, top_k=4),
}
results = {}
for name, make in mixers.items():
    m = make(); owner = [type(m).__name__]
    seq = name.split("/")[0] in ("QCAttention", "InnerFuncAttention", "SSD")
    cases = {"width": torch.randn(2,5,16), "int": torch.ones(2,5,32,dtype=torch.long), "float64": torch.randn(2,5,32,dtype=torch.float64)}
    if seq: cases["rank2"] = torch.randn(5, 32)
    for c, x in cases.items():
        results[f"{name} {c}"] = named(lambda: m(x), owner)
    for c, shape in (("T=0", (2,0,32)), ("B=0", (0,5,32))):
        results[f"{name} {c}"] = named(lambda: m(torch.randn(shape)), owner, should_work=True)
    if seq:
        mask = torch.zeros(2, 6, dtype=torch.bool); mask[1, :3] = True
        x = torch.randn(2, 6, 32); pos = torch.arange(6).expand(2, 6)
        x2 = x.clone(); x2[mask] = float("nan")
        results[f"{name} NaN padding"] = named(lambda: m(x2, Context(position_ids=pos, padding_mask=mask)), owner, should_work=True,
                                              check=lambda y: bool(torch.isfinite(y[~mask]).all()))
for name in ("RoutedMoE", "CDMoE"):
    m = mixers[name]()
    mask = torch.zeros(2, 6, dtype=torch.bool); mask[1, :3] = True
    x = torch.randn(2, 6, 32); x[mask] = float("nan")
    model = HybridLM(50, 32, "AR" if name == "RoutedMoE" else "AE")
    ids = torch.randint(1, 50, (2, 6))
    with torch.no_grad(): model.embedding.weight[0] = float("nan")
    ids[mask] = 0
    def run():
        model(ids, padding_mask=mask); return {**model.auxiliary_losses(), **model.expert_loads()}
    results[f"HybridLM {name} aux loss with NaN padding"] = named(run, ["HybridLM"], should_work=True,
        check=lambda aux: bool(aux) and all(bool(torch.isfinite(v).all()) for v in aux.values()))
model = HybridLM(50, 32, "AM")
ids = torch.zeros(2, 3, dtype=torch.long)
results["HybridLM int padding mask"] = named(lambda: model(ids, padding_mask=torch.zeros(2, 3, dtype=torch.long)), ["HybridLM", "Context", "attention"])
results["HybridLM T=0"] = named(lambda: model(torch.zeros(2, 0, dtype=torch.long)), ["HybridLM"], should_work=True)
for p in ["SM×²", "SM×٣", "SM×" + "9" * 5000, "((SM×1000)×1000)×1000", "(" * 5000 + "SM" + ")" * 5000]:
    results[f"pattern {p[:12]!r}"] = named(lambda: parse_pattern(p), ["pattern"])
from recipes.data import TextCorpus
d = tempfile.mkdtemp()
open(f"{d}/e.txt", "w").write("")
open(f"{d}/l.txt", "wb").write("café ".encode("latin-1") * 50)
results["TextCorpus empty file"] = named(lambda: TextCorpus(f"{d}/e.txt").setup(), ["TextCorpus"])
results["TextCorpus latin-1 file"] = named(lambda: TextCorpus(f"{d}/l.txt").setup(), ["TextCorpus"])
from recipes import LanguageModel
lm = LanguageModel(16, "AM", vocab_size=20)
batch = {"input_ids": torch.randint(0, 20, (2, 6)), "labels": torch.full((2, 6), -100)}
results["all labels ignored"] = named(lambda: lm.forward_loss(batch)[0], ["LanguageModel"], should_work=True, check=lambda l: bool(torch.isfinite(l)))
counts = {}
for k, v in results.items():
    kind = v.split(":")[0]
    counts[kind] = counts.get(kind, 0) + 1
    if kind not in ("named", "works"): print(f"  {k}: {v}")
print(len(results), "cases:", counts)
