"""``python -m recipes.benchmarks.loss_step``: a row per config, both loss forms timed, and the training loss
left as it was found (the benchmark swaps the form ``LanguageModel.training_loss`` calls)."""

from zoo_kernels.linear_cross_entropy import linear_cross_entropy_parts
from recipes import module
from recipes.benchmarks import loss_step


def test_the_table_has_a_row_per_config_and_the_chunked_loss_is_restored(capsys):
    loss_step.main(["quickstart.yaml", "--rounds", "1"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| quickstart")]
    assert len(rows) == 1 and float(rows[0][1]) > 0 and float(rows[0][2]) > 0 and rows[0][3].endswith(" |")
    assert module.linear_cross_entropy_parts is linear_cross_entropy_parts


def test_each_form_is_the_one_the_training_loss_calls(monkeypatch):
    called = []
    for name, form in loss_step.FORMS.items():
        monkeypatch.setitem(loss_step.FORMS, name, lambda *a, _name=name, _form=form, **k: called.append(_name) or _form(*a, **k))
    loss_step.step_seconds("quickstart.yaml", rounds=1)
    assert set(called) == {"written-out logits", "in chunks"} and len(called) == 4  # warm-up and one round each
    assert module.linear_cross_entropy_parts is linear_cross_entropy_parts
