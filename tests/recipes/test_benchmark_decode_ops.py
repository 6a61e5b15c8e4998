"""``python -m recipes.benchmarks.decode_ops`` at a tiny size: its op counter, and what it shows of a step — on an
accelerator the zoo's attention keeps its non-finite bookkeeping with one op a layer beyond the CPU's shortcut,
without cleaning ops and without reading anything back."""

import pytest
import torch

from recipes.benchmarks import decode_ops

pytest.importorskip("transformers")


def test_the_counter_counts_launching_ops_by_name_and_leaves_views_out():
    x = torch.randn(4, 6)
    with decode_ops.OpCount() as count:
        y = (x.view(6, 4).t() * 2 + 1).sum(0)
        torch.empty(3)
        bool(y.max() > 0)
    assert dict(count.ops) == {"mul": 1, "add": 1, "sum": 1, "max": 1, "gt": 1, "_local_scalar_dense": 1}
    assert decode_ops.SYNCS & set(count.ops) == {"_local_scalar_dense"}
    assert decode_ops.step_ops(lambda n: [torch.ones(1) * 2 for _ in range(n)]) == {"ones": 1, "mul": 1}  # 5 less 4


def test_the_table_counts_each_forms_step_and_checks_its_tokens(capsys):
    rows = decode_ops.main(["--models", "llama", "hybrid", "--width", "64", "--layers", "2", "--vocab", "61",
                            "--prompt", "5", "--new-tokens", "4", "--rounds", "1"])
    out = capsys.readouterr().out
    forms = {(r["model"], r["form"]): r for r in rows}
    assert set(forms) == {("llama", "hf"), ("llama", "zoo, CPU"), ("llama", "zoo, accelerator"),
                          ("hybrid", "zoo, CPU"), ("hybrid", "zoo, accelerator")}
    assert all(r["argmax"] == "ok" for r in rows) and out.count("| ok |") == 5
    for model, attention_layers in (("llama", 2), ("hybrid", 1)):  # the hybrid of 2 layers: "SM AM"
        cpu, accelerator = forms[model, "zoo, CPU"], forms[model, "zoo, accelerator"]
        assert cpu["syncs"] == attention_layers and accelerator["syncs"] == 0  # the CPU's one sum read back a layer
        # 4 ops a layer for the CPU's sum (2 sums, 2 adds), 5 for the accelerator's flags: a step cleans nothing
        assert accelerator["ops"] - cpu["ops"] == attention_layers
        assert not {"nan_to_num", "any", "where"} & set(accelerator["kinds"])
    assert forms["llama", "hf"]["ops"] > 0 and forms["hybrid", "zoo, CPU"]["ratio"] in (None, 1.0)


def test_a_gpu_counts_the_zoo_as_it_runs_there():
    assert list(decode_ops.zoo_forms(None, None, "cuda")) == ["zoo"]  # no shortcut to force off there
    assert list(decode_ops.zoo_forms(None, None, "cpu")) == ["zoo, CPU", "zoo, accelerator"]
