"""The tile searches (recipes/benchmarks/attention_tiles.py, ssd_tiles.py) as dry runs under the interpreter at tiny
shapes: every candidate is run, checked against the current tiles and put in its kernel's table; a candidate the
kernels cannot take (a tile of 24 rows: Triton takes powers of two) is named as failed and the search goes on; the real
``launch_config`` is back afterwards."""

import json
import re

import pytest
import torch

from zoo_kernels.attention import triton as attention_triton
from zoo_kernels.ssd import triton as ssd_triton
from recipes.benchmarks import attention_tiles, ssd_tiles


# the dry runs need the interpreter, which the tests set up only where there is no GPU (tests/conftest.py)
dry_run = pytest.mark.skipif(torch.cuda.is_available(), reason="a dry run under the interpreter: CPU machines only")


# the SSD search at tiny shapes under the interpreter (each test adds its length and sections)
SSD_DRY_RUN = ["--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--state", "16", "--chunk", "16",
               "--repeats", "1"]


def table_rows(out: str, title: str) -> list[list[str]]:
    """The cells of the rows of the table under the heading that starts with ``### title``."""
    section = out.split(f"### {title}", 1)[1].split("###", 1)[0]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in section.splitlines()
            if re.match(r"\| \d", line)]


@dry_run
def test_the_attention_search_times_and_checks_each_kernels_candidates(monkeypatch, capsys):
    original = attention_triton.launch_config
    monkeypatch.setattr(attention_tiles, "CANDIDATES", {"forward": [(32, 16, 4, 1), (24, 16, 4, 1)],
                                                         "backward_q": [(16, 32, 4, 1)],
                                                         "backward_kv": [(16, 16, 4, 1)]})
    attention_tiles.main(["--device", "cpu", "--head-dims", "16", "--length", "37", "--batch", "1", "--heads", "2",
                          "--repeats", "1"])
    out = capsys.readouterr().out
    forward, dq, dkv = (table_rows(out, part) for part in ("forward", "backward_q", "backward_kv"))
    assert [row[:4] for row in forward] == [["32", "16", "4", "1"], ["24", "16", "4", "1"]]
    assert float(forward[0][-1]) < 1e-5 and forward[1][4].startswith("failed")
    assert [row[:4] for row in dq] == [["16", "32", "4", "1"]] and float(dq[0][-1]) < 1e-5
    assert [row[:4] for row in dkv] == [["16", "16", "4", "1"]] and float(dkv[0][-1]) < 1e-5
    assert attention_triton.launch_config is original


@dry_run
def test_the_ssd_search_times_and_checks_its_candidates(monkeypatch, capsys):
    original = ssd_triton.launch_config
    monkeypatch.setattr(ssd_tiles, "SHARED", [(32, 4, 1), (24, 4, 1)])
    monkeypatch.setattr(ssd_tiles, "LOG_DECAY", [(16, 32)])
    monkeypatch.setattr(ssd_tiles, "GROUP", [(16, 4, 16, 16, 2), (24, 4, 16, 16, 4)])
    monkeypatch.setattr(ssd_tiles, "Y", [(32, 16, 4, 1, 16), (16, 24, 4, 1, None)])
    monkeypatch.setattr(ssd_tiles, "DX", [(16, 32, 4, 1)])
    monkeypatch.setattr(ssd_tiles, "PAIRS", [(32, 16, 2, 1)])
    tiles_seen, tiles = [], ssd_triton._tiles
    monkeypatch.setattr(ssd_triton, "_tiles", lambda blk, kernel: tiles_seen.append((kernel, tiles(blk, kernel)))
                        or tiles_seen[-1][1])
    ssd_tiles.main([*SSD_DRY_RUN, "--length", "21"])
    out = capsys.readouterr().out
    shared, log_decay = table_rows(out, "rows, warps"), table_rows(out, "pair_rows")
    assert [row[:3] for row in shared] == [["32", "4", "1"], ["24", "4", "1"]]
    assert float(shared[0][-1]) < 1e-5 and shared[1][3].startswith("failed")
    assert [row[:2] for row in log_decay] == [["16", "32"]] and float(log_decay[0][-1]) < 1e-5
    group = table_rows(out, "group_rows")  # with the scores shared (2 heads to a group: they pay)
    assert [row[:6] for row in group] == [["16", "4", "16", "16", "2", "True"], ["24", "4", "16", "16", "4", "True"]]
    assert float(group[0][-1]) < 1e-5 and group[1][6].startswith("failed")
    # the group scores (2 heads of 16 to a group of chunk 16: they pay, so they are made), checked like the tiles
    for section in ("shared_scores", "narrow_states", "keep_states"):  # (in fp32 narrow states are fp32 states)
        rows = [line for line in out.split(f"### {section}", 1)[1].split("###", 1)[0].splitlines()
                if line.startswith("| True |")]
        assert len(rows) == 1 and float(rows[0].split("|")[-2]) < 1e-5, section
    # each scan kernel's own tiles: checked like the others, and given to that kernel alone
    y, dx = table_rows(out, "y rows"), table_rows(out, "dx rows")
    assert [row[:5] for row in y] == [["32", "16", "4", "1", "16"], ["16", "24", "4", "1", "None"]]
    assert float(y[0][-1]) < 1e-5 and y[1][5].startswith("failed")
    assert [row[:4] for row in dx] == [["16", "32", "4", "1"]] and float(dx[0][-1]) < 1e-5
    assert y[0][-3:-1] == ["-", "-"]  # the kernels' GPU time: none under the interpreter
    assert ("y", dict(rows=32, cols=16, warps=4, stages=1, p_block=16, order="chunks")) in tiles_seen
    assert ("dx", dict(rows=16, cols=32, warps=4, stages=1, p_block=None, order="chunks")) in tiles_seen
    assert ("y", dict(rows=16, cols=16, warps=4, stages=1, p_block=None, order="chunks")) in tiles_seen  # the current ones
    pairs = table_rows(out, "pairs rows")
    assert [row[:4] for row in pairs] == [["32", "16", "2", "1"]] and float(pairs[0][-1]) < 1e-5
    assert ("pairs", dict(rows=32, cols=16, warps=2, stages=1, p_block=None, order="chunks")) in tiles_seen
    assert ("pairs", dict(rows=16, cols=16, warps=4, stages=1, p_block=None, order="chunks")) in tiles_seen  # pair_rows, pair_cols
    # the grid orders: each checked against the current one (the chunks innermost under the interpreter)
    order = [line for line in out.split("### order", 1)[1].split("###", 1)[0].splitlines()
             if re.match(r"\| (chunks|heads|blocks) \|", line)]
    assert [row.split("|")[1].strip() for row in order] == ["heads", "blocks"]
    assert all(float(row.split("|")[-2]) < 1e-5 for row in order)
    group_order = [line for line in out.split("### group_order", 1)[1].split("###", 1)[0].splitlines()
                   if line.startswith("| blocks | True |")]
    assert len(group_order) == 1 and float(group_order[0].split("|")[-2]) < 1e-5
    assert re.search(r"current, check_finite=False: [\d.]+ ms forward, [\d.]+ fwd\+bwd", out)
    assert ssd_triton.launch_config is original


@dry_run
def test_the_ssd_search_times_only_the_sections_asked_for(capsys):
    ssd_tiles.main([*SSD_DRY_RUN, "--length", "20", "--sections", "scores"])
    out = capsys.readouterr().out
    assert "### shared_scores" in out and "### rows" not in out and "### pair_rows" not in out


@pytest.mark.parametrize("search", [attention_tiles, ssd_tiles])
def test_without_a_gpu_the_search_says_so(search, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit, match="there is none here"):
        search.main([])


@dry_run
def test_the_ssd_search_puts_each_sections_winner_together(monkeypatch, capsys):
    """Every candidate timed faster than the current tiles (the wall times are stand-ins: under the interpreter they
    say nothing): each section's fastest wins, and the winners are run together, checked against the current tiles."""
    from recipes.benchmarks import tile_search

    timings = iter([5.0, 1.0, 2.0, 3.0] * 100)  # per candidate: forward, fwd+bwd (the current tiles': ssd_tiles' own)
    monkeypatch.setattr(tile_search, "median_ms", lambda fn, repeats, warmup: (fn(), next(timings))[1])
    monkeypatch.setattr(ssd_tiles, "median_ms", lambda fn, repeats, warmup: (fn(), 9.0)[1])
    monkeypatch.setattr(ssd_tiles, "Y", [(32, 16, 4, 1, 16), (16, 16, 4, 1, None)])
    monkeypatch.setattr(ssd_tiles, "DX", [(16, 32, 4, 1)])
    ssd_tiles.main([*SSD_DRY_RUN, "--length", "21", "--sections", "y", "dx"])
    out = capsys.readouterr().out
    # y's candidates read 1.0 and 3.0 ms fwd+bwd, the first wins; dx's one reads 1.0 (the cycle 5, 1, 2, 3 again)
    entries = re.search(r"launch_config entries: (\{.*\})", out).group(1)
    assert eval(entries) == {"y": dict(rows=32, cols=16, warps=4, stages=1, p_block=16),
                             "dx": dict(rows=16, cols=32, warps=4, stages=1)}
    together = re.search(r"together: ([\d.]+) ms forward, ([\d.]+) fwd\+bwd \(([\d.]+)× current\); "
                         r"max error against current (\S+)", out)
    assert together and float(together.group(4)) < 1e-5
    assert float(together.group(3)) == pytest.approx(9.0 / float(together.group(2)), rel=0.01)


@dry_run
def test_the_ssd_search_puts_nothing_together_when_nothing_won(monkeypatch, capsys):
    from recipes.benchmarks import tile_search

    monkeypatch.setattr(tile_search, "median_ms", lambda fn, repeats, warmup: (fn(), 10.0)[1])
    monkeypatch.setattr(ssd_tiles, "median_ms", lambda fn, repeats, warmup: (fn(), 9.0)[1])
    monkeypatch.setattr(ssd_tiles, "DX", [(16, 32, 4, 1)])
    ssd_tiles.main([*SSD_DRY_RUN, "--length", "20", "--sections", "dx"])
    out = capsys.readouterr().out
    assert "nothing to put together" in out and "launch_config entries" not in out


def test_the_order_section_gives_each_scan_kernel_its_fastest_order():
    """Taken apart by kernel (the profiler's time of each): ``y`` fastest with the blocks innermost, ``dx`` as it is,
    the pair kernel with the chunks innermost — the entries give each its own order, and the sum is of the three
    fastest; where every kernel is fastest as it is, nothing changes."""
    live = ssd_triton.launch_config(64, 128, True, torch.bfloat16, 90)
    hopper = {**live, "order": "heads", **{kernel: {key: value for key, value in live[kernel].items() if key != "order"}
                                           for kernel in ("y", "dx", "pairs")}}  # every kernel on the heads innermost
    now = {"_chunk_scan": 900.0, "_chunk_scan_reverse": 1000.0, "_log_decay_pairs": 950.0}
    timed = [(("chunks",), {"_chunk_scan": 1000.0, "_chunk_scan_reverse": 1100.0, "_log_decay_pairs": 900.0}),
             (("blocks",), {"_chunk_scan": 800.0, "_chunk_scan_reverse": 1050.0, "_log_decay_pairs": 960.0})]
    total, change = ssd_tiles.per_kernel_orders(hopper, now, timed)
    assert total == 800 + 1000 + 900
    assert change == {"y": {"order": "blocks"}, "pairs": {"order": "chunks"}}
    chosen = ssd_triton.with_entries(hopper, change)  # each entry's tiles kept, its order changed
    assert chosen["y"] == {**hopper["y"], "order": "blocks"}
    assert chosen["pairs"] == {**hopper["pairs"], "order": "chunks"}
    assert [ssd_triton._tiles(chosen, k)["order"] for k in ("y", "dx", "pairs")] == ["blocks", "heads", "chunks"]
    # a y section's winner and the order section's, put together: the tiles of the one, the order of the other
    tiles = {"y": dict(rows=32, cols=16, warps=4, stages=3, p_block=None)}
    assert ssd_triton.with_entries(ssd_triton.with_entries({}, tiles), change)["y"] == {**tiles["y"], "order": "blocks"}
    slower = [(order, {k: us + 1 for k, us in now.items()}) for order, _ in timed]
    assert ssd_tiles.per_kernel_orders(hopper, now, slower) is None
    as_fast = [(order, dict(now)) for order, _ in timed]  # no faster: the order it has is kept
    assert ssd_tiles.per_kernel_orders(hopper, now, as_fast) is None


def test_a_candidate_is_timed_only_when_its_results_match_the_current_tiles(monkeypatch):
    """``trial``: while it runs, ``launch_config`` answers the candidate; the candidate's error is the largest over its
    results, each relative to that result's largest value; up to 5% it is timed (each timed function's median, then
    each gauge's value), past 5% or not finite it is named wrong, and one that raises is named failed — and
    ``launch_config`` is the kernel module's own again after each."""
    from types import SimpleNamespace

    from recipes.benchmarks import tile_search

    own = lambda *args, **kwargs: {"tiles": "current"}  # noqa: E731
    kernels = SimpleNamespace(launch_config=own)
    want = [torch.tensor([1.0, -4.0]), torch.tensor([20.0])]
    answered = []

    def off_by(first: float, second: float):
        def results():
            answered.append(kernels.launch_config(64, 128))
            return [want[0] + torch.tensor([0.0, first]), want[1] + second]
        return results

    timings = iter([3.0, 5.0])
    monkeypatch.setattr(tile_search, "median_ms",
                        lambda fn, repeats, warmup: (fn(), next(timings) * repeats + warmup)[1])
    called = []
    error, measured = tile_search.trial(kernels, {"tiles": "candidate"}, off_by(0.125, 0.5), want,
                                        [lambda: called.append("fwd"), lambda: called.append("both")], 2,
                                        (lambda: 7.0, lambda: None), warmup=3)
    assert answered == [{"tiles": "candidate"}] and kernels.launch_config is own
    assert error == 0.125 / 4 and measured == [9.0, 13.0, 7.0, None] and called == ["fwd", "both"]
    assert tile_search.trial(kernels, {}, off_by(0.0, 1.0), want, [], 1) == (0.05, [])  # 5% exactly: still right
    for first, second, named in [(0.0, 1.25, "wrong: relative error 0.0625"),
                                 (0.25, 0.0, "wrong: relative error 0.0625"),
                                 (float("nan"), 0.0, "wrong: relative error nan")]:
        assert tile_search.trial(kernels, {}, off_by(first, second), want, [lambda: 1 / 0], 1) == named
        assert kernels.launch_config is own

    def too_large():
        raise RuntimeError("out of resource: shared memory, Required: 262144\nHardware limit: 232448")

    assert tile_search.trial(kernels, {}, too_large, want, [], 1) == \
        "failed: RuntimeError: out of resource: shared memory, Required: 262144"
    assert tile_search.trial(kernels, {}, off_by(0.0, 0.0), want, [lambda: 1 / 0], 1) == \
        "failed: ZeroDivisionError: division by zero"
    assert kernels.launch_config is own


def test_a_kernels_gpu_time_is_its_profiled_time_per_call(monkeypatch):
    """``kernel_us`` (the profiler is CUDA's; here a stand-in that reports what a GPU's would): one warm-up call
    outside the profiler, then ``repeats`` inside; each named kernel's self time over the calls, divided by them —
    exactly the names asked for, 0 for one that did not run."""
    from types import SimpleNamespace

    from recipes.benchmarks import tile_search

    profiling = []

    class Profiler:
        def __init__(self, activities):
            assert activities == [torch.profiler.ProfilerActivity.CUDA]

        def __enter__(self):
            profiling.append(True)
            return self

        def __exit__(self, *failure):
            profiling.append(False)

        def key_averages(self):
            return [SimpleNamespace(key="_chunk_scan", self_device_time_total=900.0),
                    SimpleNamespace(key="_chunk_scan_reverse", self_device_time_total=3000.0),
                    SimpleNamespace(key="aten::mm", self_device_time_total=60.0)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.profiler, "profile", Profiler)
    calls = []
    spent = tile_search.kernel_us(lambda: calls.append(bool(profiling) and profiling[-1]),
                                  ("_chunk_scan", "_log_decay_pairs"), repeats=3)
    assert spent == {"_chunk_scan": 300.0, "_log_decay_pairs": 0.0}
    assert calls == [False, True, True, True]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tile_search.kernel_us(lambda: calls.append("run"), ("_chunk_scan",), 3) is None and "run" not in calls


@dry_run
def test_where_the_profiler_times_the_kernels_their_gpu_time_picks_the_winners(monkeypatch, capsys, tmp_path):
    """On a GPU a section's rows give the GPU time of the kernels it changes (torch's profiler: here a stand-in that
    reads the tiles in effect), and its winner is the candidate fastest by that time, not by the wall clock; the
    ``order`` section also takes the kernels apart, each its fastest order. The wall times (stand-ins too) are of
    the kernels alone (``check_finite=False``)."""
    from recipes.benchmarks import tile_search

    def kernel_us(fn, names, repeats):  # µs of each kernel under the tiles launch_config gives now
        config = ssd_triton.launch_config(16, 16, False, torch.float32, 90)
        y, dx, pairs = (ssd_triton._tiles(config, kernel) for kernel in ("y", "dx", "pairs"))
        spent = {"_chunk_scan": {"chunks": 900.0, "heads": 1000.0, "blocks": 800.0}[y["order"]],
                 "_chunk_scan_reverse": {"chunks": 1000.0, "heads": 1100.0, "blocks": 1050.0}[dx["order"]],
                 "_log_decay_pairs": {"chunks": 950.0, "heads": 900.0, "blocks": 960.0}[pairs["order"]]}
        spent.update(_chunk_state=500.0, _decayed_scan=500.0)  # whatever the tiles (keep_states among them)
        if y["p_block"] == 16:
            spent["_chunk_scan"] = 1200.0
        elif y["cols"] == 32:
            spent["_chunk_scan"] = 850.0
        return {name: spent[name] for name in names}

    walls, finite_checked = iter([5.0, 1.0, 5.0, 3.0] * 10), []  # per candidate: forward, then fwd+bwd
    scan = ssd_tiles.ssd_scan
    monkeypatch.setattr(ssd_tiles, "ssd_scan", lambda *args, **kwargs: (
        finite_checked.append(kwargs.get("check_finite", True)), scan(*args, **kwargs))[1])

    def wall_ms(fn, repeats, warmup):
        finite_checked.clear()
        fn()
        assert finite_checked == [False] and warmup == 0  # a dry run: nothing compiled to warm up
        return next(walls)

    monkeypatch.setattr(tile_search, "median_ms", wall_ms)
    monkeypatch.setattr(ssd_tiles, "median_ms", lambda fn, repeats, warmup: (fn(), 9.0)[1])
    monkeypatch.setattr(ssd_tiles, "kernel_us", kernel_us)
    monkeypatch.setattr(ssd_tiles, "Y", [(32, 16, 4, 1, 16), (16, 32, 4, 1, None)])
    winners = tmp_path / "gpu" / "ssd_winners.json"
    ssd_tiles.main([*SSD_DRY_RUN, "--length", "21", "--sections", "y", "order", "keep",
                    "--write-winners", str(winners)])
    out = capsys.readouterr().out
    assert "current _chunk_scan: 900 µs of GPU time per fwd+bwd\n" in out
    assert ("| rows | cols | warps | stages | p_block | fwd ms | fwd+bwd ms | × current fwd+bwd | _chunk_scan µs | "
            "× current µs | max error against current |") in out  # one kernel: no column of each kernel's time
    assert {len(row) for row in table_rows(out, "y rows")} == {11}
    # y: the first candidate is the faster by the wall clock (1.0 ms against 3.0), the slower in _chunk_scan
    assert [row[5:10] for row in table_rows(out, "y rows")] == [["5.00", "1.00", "9.00", "1200", "0.75"],
                                                                 ["5.00", "3.00", "3.00", "850", "1.06"]]
    assert ("current _chunk_scan + _chunk_scan_reverse + _log_decay_pairs: 2850 µs of GPU time per fwd+bwd "
            "(900 / 1000 / 950)") in out
    orders = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
              for line in out.split("### order", 1)[1].split("###", 1)[0].splitlines()
              if re.match(r"\| (heads|blocks) \|", line)}
    assert {order: cells[3:6] for order, cells in orders.items()} == {
        "heads": ["3000", "0.95", "1000 / 1100 / 900"], "blocks": ["2810", "1.01", "800 / 1050 / 960"]}
    # keep_states: faster by the wall clock (1.0 ms), as fast by the kernels' time (two of them): no winner
    assert "current _chunk_state + _decayed_scan: 1000 µs of GPU time per fwd+bwd (500 / 500)" in out
    keep = [line for line in out.split("### keep_states", 1)[1].split("###", 1)[0].splitlines()
            if line.startswith("| True |")]
    assert [c.strip() for c in keep[0].split("|")[2:-2]] == ["5.00", "1.00", "9.00", "1000", "1.00", "500 / 500"]
    # the blocks innermost beat the current order by 40 µs; each kernel its own order beats that by 110
    assert "each kernel its fastest order: {'y': {'order': 'blocks'}, 'pairs': {'order': 'heads'}} (2700 µs)" in out
    change = {"y": dict(rows=16, cols=32, warps=4, stages=1, p_block=None, order="blocks"),
              "pairs": {"order": "heads"}}
    assert eval(re.search(r"launch_config entries: (\{.*\})", out).group(1)) == change
    assert json.loads(winners.read_text()) == change
    # where every kernel is fastest as it is, no order wins and nothing is put together
    monkeypatch.setattr(ssd_tiles, "kernel_us", lambda fn, names, repeats: {
        name: 100.0 if ssd_triton._tiles(ssd_triton.launch_config(16, 16, False, torch.float32, 90), "y")["order"]
        == "chunks" else 200.0 for name in names})
    ssd_tiles.main([*SSD_DRY_RUN, "--length", "21", "--sections", "order",
                    "--write-winners", str(winners)])
    out = capsys.readouterr().out
    assert "each kernel its fastest order" not in out and "nothing to put together" in out
    assert not winners.exists()  # the earlier run's winners are not left to be mistaken for this one's


def test_the_winners_together_are_kept_only_where_they_beat_the_current_tiles(capsys, tmp_path):
    """``together``: the sections' entries laid over each other (a kernel's entry key by key) and over the current
    tiles, run once; kept only where that run passed its check and beat the current forward and backward —
    as fast is not worth a change. ``write_winners`` writes them (its folder too) or removes a stale file."""
    winners = {"y": (850.0, {"y": {"rows": 16, "cols": 32}}),
               "order": (2700.0, {"y": {"order": "blocks"}, "pairs": {"order": "heads"}})}
    current = {"rows": 32, "warps": 4, "y": {"rows": 32, "cols": 64, "order": "heads"}}
    change = {"y": {"rows": 16, "cols": 32, "order": "blocks"}, "pairs": {"order": "heads"}}
    ran = []
    assert ssd_tiles.together(winners, current, lambda config: ran.append(config) or (1e-3, (4.0, 9.0)), 9.0, None) \
        is None
    assert ran == [{"rows": 32, "warps": 4, "y": {"rows": 16, "cols": 32, "order": "blocks"},
                    "pairs": {"order": "heads"}}]
    assert ssd_tiles.together(winners, current, lambda config: (1e-3, (4.0, 8.0)), 9.0, 12.0) == change
    assert ("together: 4.00 ms forward, 8.00 fwd+bwd (1.12× current, 1.50× mamba_chunk_scan_combined's fwd+bwd); "
            "max error against current 1.0e-03") in capsys.readouterr().out
    assert ssd_tiles.together(winners, current, lambda config: "wrong: relative error 0.5", 9.0, None) is None
    assert "together: wrong: relative error 0.5" in capsys.readouterr().out
    path = tmp_path / "gpu" / "k" / "ssd_winners.json"
    ssd_tiles.write_winners(str(path), change)
    assert json.loads(path.read_text()) == change
    ssd_tiles.write_winners(str(path), None)
    assert not path.exists()
    ssd_tiles.write_winners(str(path), None)  # nothing there to remove: still no error
    assert "no winners to write" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy: the module is imported already
@pytest.mark.parametrize("search", ["recipes.benchmarks.attention_tiles", "recipes.benchmarks.ssd_tiles"])
def test_the_searches_are_commands(search, monkeypatch, capsys):
    import runpy

    monkeypatch.setattr("sys.argv", [search, "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(search, run_name="__main__")
    assert done.value.code == 0 and f"usage: python -m {search}" in capsys.readouterr().out


@dry_run
def test_the_attention_search_times_each_kernel_through_its_own_pass(monkeypatch, capsys):
    """The forward kernel's candidates are timed by the forward alone (no graph kept), the two backward kernels' by
    forward and backward, the bias's gradient included; each table is headed by the current tiles' time of that
    pass, and its TFLOP/s count the causal half of the scores, forward and backward as 3.5 forwards. The baselines:
    SDPA causal without a bias, and the reference's route."""
    from recipes.benchmarks import tile_search

    real_attention, real_sdpa, seen = attention_tiles.attention, attention_tiles.F.scaled_dot_product_attention, []
    monkeypatch.setattr(attention_tiles, "attention", lambda q, k, v, bias, backend: (
        seen.append((backend, torch.is_grad_enabled(), bias.requires_grad)), real_attention(q, k, v, bias=bias,
                                                                                              backend=backend))[1])
    monkeypatch.setattr(attention_tiles.F, "scaled_dot_product_attention", lambda *args, **kwargs: (
        seen.append(("sdpa", kwargs.get("is_causal"))), real_sdpa(*args, **kwargs))[1])
    timed, warmups, baselines = [], [], iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])

    def recorded(ms):
        def median_ms(fn, repeats, warmup):
            seen.clear()
            fn()
            timed.append(list(seen))
            warmups.append(warmup)
            return ms() if callable(ms) else ms
        return median_ms

    monkeypatch.setattr(attention_tiles, "median_ms", recorded(lambda: next(baselines)))
    monkeypatch.setattr(tile_search, "median_ms", recorded(1e-9))  # so the TFLOP/s of these tiny shapes show
    monkeypatch.setattr(attention_tiles, "CANDIDATES", {"forward": [(16, 16, 4, 1)], "backward_q": [(16, 16, 4, 1)],
                                                         "backward_kv": [(16, 16, 4, 1)]})
    attention_tiles.main(["--device", "cpu", "--head-dims", "16", "--length", "37", "--batch", "1", "--heads", "2",
                          "--repeats", "1"])
    out = capsys.readouterr().out
    assert timed[0][0] == ("sdpa", True) and timed[1][0] == ("sdpa", True)  # (the reference's route follows)
    assert warmups == [0] * len(timed)  # a dry run: nothing compiled to warm up
    assert timed[2][0] == ("reference", False, True) and timed[3][0] == ("reference", True, True)
    assert timed[4:] == [[("triton", False, True)], [("triton", True, True)], [("triton", False, True)],
                         [("triton", True, True)], [("triton", True, True)]]
    assert "SDPA without a bias 1.00 ms forward, 2.00 fwd+bwd; the reference's SDPA route 3.00 / 4.00" in out
    assert re.search(r"### forward \(current: .*: 5\.00 ms forward\)", out)
    assert re.search(r"### backward_q \(current: .*: 6\.00 ms fwd\+bwd\)", out)
    flops = 4 * 1 * 2 * 37 * 37 * 16 / 2 / 1e-12 / 1e12
    tflops = [row[6] for part in ("forward", "backward_q", "backward_kv") for row in table_rows(out, part)]
    assert tflops == [f"{flops:.0f}", f"{3.5 * flops:.0f}", f"{3.5 * flops:.0f}"]
