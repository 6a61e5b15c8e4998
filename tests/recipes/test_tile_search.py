"""The tile searches (recipes/benchmarks/attention_tiles.py, ssd_tiles.py) as dry runs under the interpreter at tiny
shapes: every candidate is run, checked against the current tiles and put in its kernel's table; a candidate the
kernels cannot take (a tile of 24 rows: Triton takes powers of two) is named as failed and the search goes on; the real
``launch_config`` is back afterwards."""

import re

import pytest
import torch

from kernels.attention import triton as attention_triton
from kernels.ssd import triton as ssd_triton
from recipes.benchmarks import attention_tiles, ssd_tiles


# the dry runs need the interpreter, which the tests set up only where there is no GPU (tests/conftest.py)
dry_run = pytest.mark.skipif(torch.cuda.is_available(), reason="a dry run under the interpreter: CPU machines only")


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
    ssd_tiles.main(["--device", "cpu", "--length", "21", "--batch", "1", "--heads", "2", "--head-dim", "16",
                    "--state", "16", "--chunk", "16", "--repeats", "1"])
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
    ssd_tiles.main(["--device", "cpu", "--length", "20", "--batch", "1", "--heads", "2", "--head-dim", "16",
                    "--state", "16", "--chunk", "16", "--repeats", "1", "--sections", "scores"])
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
    monkeypatch.setattr(tile_search, "median_ms", lambda fn, repeats: (fn(), next(timings))[1])
    monkeypatch.setattr(ssd_tiles, "median_ms", lambda fn, repeats: (fn(), 9.0)[1])
    monkeypatch.setattr(ssd_tiles, "Y", [(32, 16, 4, 1, 16), (16, 16, 4, 1, None)])
    monkeypatch.setattr(ssd_tiles, "DX", [(16, 32, 4, 1)])
    ssd_tiles.main(["--device", "cpu", "--length", "21", "--batch", "1", "--heads", "2", "--head-dim", "16",
                    "--state", "16", "--chunk", "16", "--repeats", "1", "--sections", "y", "dx"])
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

    monkeypatch.setattr(tile_search, "median_ms", lambda fn, repeats: (fn(), 10.0)[1])
    monkeypatch.setattr(ssd_tiles, "median_ms", lambda fn, repeats: (fn(), 9.0)[1])
    monkeypatch.setattr(ssd_tiles, "DX", [(16, 32, 4, 1)])
    ssd_tiles.main(["--device", "cpu", "--length", "20", "--batch", "1", "--heads", "2", "--head-dim", "16",
                    "--state", "16", "--chunk", "16", "--repeats", "1", "--sections", "dx"])
    out = capsys.readouterr().out
    assert "nothing to put together" in out and "launch_config entries" not in out


def test_the_order_section_gives_each_scan_kernel_its_fastest_order():
    """Taken apart by kernel (the profiler's time of each): ``y`` fastest with the blocks innermost, ``dx`` as it is,
    the pair kernel with the chunks innermost — the entries give each its own order, and the sum is of the three
    fastest; where every kernel is fastest as it is, nothing changes."""
    hopper = ssd_triton.launch_config(64, 128, True, torch.bfloat16, 90)  # the heads innermost
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
