"""Command-line numbers out of range are argparse's one-line error, in every command line that takes them."""

import argparse
import importlib

import pytest

import torch

from recipes.argtypes import bounded, device, positive_int

COMMAND_LINES = ["recipes.benchmarks." + name for name in (
    "attention_tiles", "compile_check", "corpus", "decode_hf", "decoding", "evaluation", "finite", "loss_step",
    "models", "ops", "ops_cpu", "ssd", "ssd_tiles", "state_mixers")] + ["recipes.corpora", "recipes.evaluation.tasks"]


def test_bounded_refuses_below_its_floor_and_keeps_the_type_name():
    assert positive_int("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="0 must be >= 1"):
        positive_int("0")
    with pytest.raises(argparse.ArgumentTypeError, match="0 must be a finite number > 0"):
        bounded(float, 0, above=True)("0")
    assert bounded(float, 0, above=True)("0.5") == 0.5
    for text in ("nan", "inf"):  # NaN passed every comparison
        with pytest.raises(argparse.ArgumentTypeError, match=f"{text} must be a finite number >= 0"):
            bounded(float, 0)(text)
    with pytest.raises(ValueError):  # argparse turns it into "invalid int value: 'x'"
        positive_int("x")
    assert positive_int.__name__ == "int"


class Captured(Exception):
    pass


def every_action(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):  # recipes.corpora's prepare / list
            for sub in action.choices.values():
                yield from every_action(sub)


@pytest.mark.parametrize("module", COMMAND_LINES)
def test_no_command_line_takes_an_unbounded_int(module, monkeypatch):
    # Every integer option here is a size, a length or a count: a plain ``type=int`` lets 0 or -1 through to a torch
    # shape error, a division by zero or an empty median (each was one, before).
    parsers = []

    def capture(self, *args, **kwargs):
        parsers.append(self)
        raise Captured

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(Captured):
        importlib.import_module(module).main([])
    actions = [action for parser in parsers for action in every_action(parser)]
    unbounded = [action.option_strings or action.dest for action in actions if action.type is int]
    assert not unbounded, f"{module}: {unbounded} take any int"
    assert any(action.type is not None and action.type.__name__ == "int" for action in actions)  # some are checked
    # and a device is one this machine has, named before anything is loaded (the tile searches, on a GPU by default,
    # name a missing one themselves, with their dry run on the CPU)
    devices = [action for action in actions if "--device" in action.option_strings and action.default != "cuda"]
    assert all(action.type is device for action in devices), f"{module}: --device takes any text"


@pytest.mark.parametrize("module, argv, said", [
    ("recipes.benchmarks.ssd", ["--heads", "0"], "argument --heads: 0 must be >= 1"),
    ("recipes.benchmarks.ops_cpu", ["--repeats", "0"], "argument --repeats: 0 must be >= 1"),
    ("recipes.benchmarks.ops", ["--profile", "-1"], "argument --profile: -1 must be >= 0"),
    # --table-only: were the bound lost, the call would tabulate (and fail fast) rather than launch a sweep
    ("recipes.sweep.cli", ["positions", "--table-only", "--threads", "0"], "argument --threads: 0 must be >= 1"),
    ("recipes.corpora", ["prepare", "english", "--out", "x", "--vocab_size", "0"], "0 must be >= 257"),
    ("recipes.sweep.cli", ["positions", "--table-only", "--margin", "0"], "argument --margin: 0 must be a finite number > 0"),
    ("recipes.sweep.cli", ["positions", "--table-only", "--devices-per-run", "0"], "argument --devices-per-run: 0 must be >= 1"),
    ("recipes.sweep.cli", ["positions", "--table-only", "--progress", "nan"], "argument --progress: nan must be a finite number >= 0"),
])
def test_an_out_of_range_number_is_one_line_before_any_work(module, argv, said, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        importlib.import_module(module).main(argv)
    assert info.value.code == 2 and said in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing downloaded or written


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_a_device_this_machine_lacks_is_named_before_any_work(capsys, tmp_path, monkeypatch):
    assert device("cpu") == "cpu" and device("cpu:0") == "cpu"  # (torch.load's map_location refuses "cpu:0")
    with pytest.raises(argparse.ArgumentTypeError, match="'gpu' is not a torch device"):
        device("gpu")
    with pytest.raises(argparse.ArgumentTypeError, match="cuda:1: CUDA is not available here"):
        device("cuda:1")
    monkeypatch.chdir(tmp_path)  # it was torch.load's "Attempting to deserialize object on a CUDA device"
    from recipes.evaluation.cli import main as evaluate
    with pytest.raises(SystemExit) as info:
        evaluate(["--config", "quickstart.yaml", "--ckpt_path", "missing.ckpt", "--suite", "length", "--device", "cuda"])
    assert info.value.code == 2 and "argument --device: cuda: CUDA is not available here" in capsys.readouterr().err


def test_a_device_index_past_the_visible_gpus_and_mps_where_there_is_none_are_named(monkeypatch):
    """On a machine with two GPUs (torch's answers stood in for): ``cuda:1`` is the last one, ``cuda:2`` is named with
    the range there is; MPS is taken only where torch says it is available."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device("cuda") == "cuda" and device("cuda:1") == "cuda:1"
    with pytest.raises(argparse.ArgumentTypeError, match=r"cuda:2: this machine has 2 CUDA device\(s\), cuda:0-1"):
        device("cuda:2")
    for available in (False, True):
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda available=available: available)
        if available:
            assert device("mps") == "mps"
        else:
            with pytest.raises(argparse.ArgumentTypeError, match="mps: MPS is not available here"):
                device("mps")
    for other in ("meta", "xpu", "hpu"):  # torch's devices that run nothing of this zoo (meta holds no weights)
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^{other}: a device of type '{other}' is not one this "
                                                             r"runs on \(cpu, cuda, cuda:N, mps\)$"):
            device(other)


def test_bounded_takes_its_floor_and_did_you_mean_names_each_close_word_once():
    from recipes.argtypes import close_matches, did_you_mean

    assert positive_int("1") == 1 and bounded(float, 0)("0") == 0.0
    assert close_matches(["lenght", "lentgh"], ["length", "depth"]) == ["length"]  # (one suggestion, not two)
    assert did_you_mean(["lenght"], ["length", "depth"]) == "did you mean length?"
    assert did_you_mean(["zzz"], ["length"]) == ""


def test_a_text_file_or_stdin_is_read_without_its_byte_order_mark(tmp_path, monkeypatch):
    """A prompt or evaluation text saved by a Windows tool starts with a byte-order mark: not part of the text (the
    model was prompted with an invisible character before)."""
    import io

    from recipes.argtypes import text_file

    (tmp_path / "p.txt").write_bytes(b"\xef\xbb\xbfdef f():\n")
    assert text_file(str(tmp_path / "p.txt")) == "def f():\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfx\xef\xbb\xbf"), encoding="utf-8"))
    assert text_file("-") == "x\ufeff"  # (only a leading one is a mark; later, it is a character of the text)
