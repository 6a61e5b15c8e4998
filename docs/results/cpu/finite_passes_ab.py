"""The finite passes before and after 2026-11-27 in one process (docs/performance.md, "Non-finite inputs"): the old
split (nan_to_num's masking backward) and poison (masked_fill) patched in for the "old" call. A record of that
measurement, kept beside its figures:  python docs/results/cpu/finite_passes_ab.py"""
import statistics, torch
import zoo_kernels.ssd as S, zoo_kernels.attention as At
import zoo_kernels._finite as F
from recipes.benchmarks.finite import ssd_case, attention_case
from recipes.benchmarks.timing import interleaved_seconds
def old_split(x, dims):
    clean, bad = F.split_finite(x.detach(), dims)
    return x.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0), bad
def old_poison(y, where):
    return y.masked_fill(where.view(*where.shape, *(1,) * (y.dim() - where.dim())), float("nan"))
new_split, new_poison = F.split_finite, F.poison
for name, case, mod in [("ssd", ssd_case, S), ("attention", attention_case, At)]:
    bare = case(2048, "cpu", torch.float32, False)[0]
    on = case(2048, "cpu", torch.float32, True)[0]
    def old():
        mod.split_finite, mod.poison = old_split, old_poison
        try: on()
        finally: mod.split_finite, mod.poison = new_split, new_poison
    t = interleaved_seconds({"bare": bare, "old": old, "new": on}, 40)
    med = {k: statistics.median(v)*1e3 for k, v in t.items()}
    d = {k: statistics.median(a-b for a,b in zip(t[k], t["bare"]))*1e3 for k in ("old","new")}
    print(name, {k: round(v,2) for k,v in med.items()}, "passes:", {k: round(v,2) for k,v in d.items()})
