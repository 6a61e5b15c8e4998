"""``recipes.benchmarks.state_mixers``: every mixer of table 1 is sized to the 4-expert MoE's total (the closest a
multiple of 8 gets), times are relative to the dense MLP's of the same run, a forward+backward time is one step's
(gradients not accumulated over the repeats), and a size that cannot be built is refused before anything is timed."""

import re

import pytest
import torch

from recipes.benchmarks import state_mixers

D_MODEL = 96  # the narrowest width at which CDMoE's 1,024 experts fit under the 4-expert MoE's total


def rows_of(table: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith(("| mixer", "| n_experts"))]


def test_each_mixer_is_the_closest_multiple_of_8_to_the_moes_total():
    target, sized = state_mixers.equal_parameter_mixers(D_MODEL)
    builds = state_mixers.mixers(D_MODEL)
    assert list(sized) == list(builds)
    moe = state_mixers.RoutedMoE(D_MODEL, n_experts=4, top_k=2, d_ff=state_mixers.default_d_ff(D_MODEL, "swiglu"))
    assert target == sum(p.numel() for p in moe.parameters())
    for name, (width, module) in sized.items():
        assert width % 8 == 0 and state_mixers.n_params(module) == state_mixers.n_params(builds[name](width)), name
        miss = abs(state_mixers.n_params(module) - target)
        for other in (width - 8, width + 8):
            assert miss <= abs(state_mixers.n_params(builds[name](other)) - target), (name, other)
        assert miss / target < 0.02, name


def test_the_table_reports_each_mixers_counts_and_times_against_the_mlps(monkeypatch):
    target, sized = state_mixers.equal_parameter_mixers(D_MODEL)
    times = dict(zip(sized, [2.0, 3.0, 5.0, 1.0, 4.0, 8.0]))  # ms, by mixer; the MLP's first
    by_module = {id(module): times[name] for name, (_, module) in sized.items()}
    monkeypatch.setattr(state_mixers, "fwd_bwd_ms", lambda module, x, repeats: by_module[id(module)])
    table = state_mixers.equal_parameter_table(D_MODEL, target, sized, tokens=40, repeats=1)
    assert f"target {target:,}, d_model {D_MODEL}, 40 tokens" in table
    rows = rows_of(table)
    assert [row[0] for row in rows] == list(sized)
    for (name, (width, module)), row in zip(sized.items(), rows):
        total, active = state_mixers.n_params(module), state_mixers.active(module)
        assert row[1:4] == [str(width), f"{total:,}", f"{active:,}"], name
        assert row[4:] == [f"{times[name]:.1f}", f"{40 / times[name] * 1e3:,.0f}", f"{times[name] / 2.0:.2f}"], name
        assert (active == total) == (name == "MLP (dense)"), name  # every MoE leaves experts idle per token


def test_a_forward_backward_time_is_one_steps_gradients(monkeypatch):
    torch.manual_seed(0)
    module, x = state_mixers.MLP(8, d_ff=16), torch.randn(1, 5, 8, requires_grad=True)
    module(x).sum().backward()
    once = [p.grad.clone() for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    assert state_mixers.fwd_bwd_ms(module, x, repeats=3) > 0  # a warm-up and three timed steps
    assert all(torch.allclose(p.grad, g) for p, g in zip(module.parameters(), once))


def test_the_scaling_table_grows_the_experts_and_times_against_the_first(monkeypatch):
    times = iter([2.0, 5.0])
    monkeypatch.setattr(state_mixers, "fwd_bwd_ms", lambda module, x, repeats: next(times))
    rows = rows_of(state_mixers.cdmoe_scaling_table(32, tokens=8, repeats=1, sizes=[256, 1024]))
    assert [row[:2] for row in rows] == [["256", "[16, 16]"], ["1,024", "[32, 32]"]]
    assert [row[4:] for row in rows] == [["2.0", "1.00"], ["5.0", "2.50"]]
    for row, n in zip(rows, (256, 1024)):
        module = state_mixers.scaling_cdmoe(32, n)
        assert row[2:4] == [f"{state_mixers.n_params(module):,}", f"{module.active_parameters():,}"]


def test_the_command_prints_both_tables(capsys):
    state_mixers.main(["--d-model", str(D_MODEL), "--tokens", "16", "--repeats", "1", "--experts", "256", "1024"])
    out = capsys.readouterr().out
    assert out.startswith(f"torch {torch.__version__}, ")
    assert len(rows_of(out)) == len(state_mixers.mixers(D_MODEL)) + 2
    assert re.search(r"\| MLP \(dense\) \| \d+ \| [\d,]+ \| [\d,]+ \| [\d.]+ \| [\d,]+ \| 1\.00 \|", out)
    assert re.search(r"\| 256 \| \[16, 16\] \| .* \| 1\.00 \|", out)


@pytest.mark.parametrize("argv, message", [
    (["--d-model", "64"], "--d-model 64: CDMoE 1024, 4 heads×top-8 cannot match the 4-expert MoE's parameters"),
    (["--d-model", "96", "--experts", "256", "1000"], "--experts 1000: CDMoE: n_experts=1000 is not a perfect square"),
    (["--d-model", "96", "--experts", "9"], "--experts 9: CDMoE: top_k=16 exceeds n_experts=9"),
])
def test_a_size_that_cannot_be_built_is_refused_before_anything_is_timed(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(state_mixers, "fwd_bwd_ms", lambda *args: pytest.fail("timed before the sizes were checked"))
    with pytest.raises(SystemExit) as exit_:
        state_mixers.main(argv + ["--tokens", "16", "--repeats", "1"])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_the_scaling_sizes_are_checked_on_the_meta_device(monkeypatch):
    # 65,536 experts at d_model 256 are 34M parameters: checked without allocating them
    devices = []
    monkeypatch.setattr(state_mixers, "scaling_cdmoe", lambda d, n: devices.append(torch.empty(0).device))
    state_mixers.check_scaling_sizes(256, [1024, 65536])
    assert devices == [torch.device("meta")] * 2
