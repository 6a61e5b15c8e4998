"""``python -m recipes generate``: text from a checkpoint, through the recipe's tokenizer."""

import pytest
import torch

from components import HybridLM
from recipes import LanguageModel
from recipes.cli import main as cli
from recipes.data import TextCorpus
from recipes.generate import main

TINY = ["--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
        "--data.init_args.seq_len", "32", "--data.init_args.batch_size", "8", "--trainer.max_steps", "30",
        "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false"]


def test_generate_prints_the_prompt_and_its_greedy_continuation(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cli(["fit", *TINY])
    capsys.readouterr()  # (the training's own output)
    text = main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "def é", "--max_new_tokens", "12"])
    assert capsys.readouterr().out.rstrip("\n") == text
    assert text.startswith("def é")
    model = LanguageModel.load_from_checkpoint(next(tmp_path.glob("runs/**/last.ckpt"))).model
    ids = model.generate(torch.tensor([TextCorpus.encode("def é")]), 12)
    assert text == TextCorpus.decode(ids[0].tolist())
    sampled = main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "a", "--max_new_tokens", "12",
                    "--temperature", "1.0", "--seed", "3"])
    assert sampled == main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "a",
                            "--max_new_tokens", "12", "--temperature", "1.0", "--seed", "3"])
    # --stop: the text ends after the stop's first occurrence in the continuation, for a one-token stop (which
    # also stops generation: its later positions, filled with the stop token, were printed before) and a longer
    # one. (Sampled text: this model's greedy continuation is all spaces.)
    base = ["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "a", "--max_new_tokens", "24",
            "--temperature", "1.0", "--seed", "3"]
    text = main(base)
    first = next(k for k in range(2, len(text)) if text[k].isascii() and text[k] not in text[1:k])
    for stop in (text[first], text[first:first + 2]):
        assert main([*base, "--stop", stop]) == text[:text.find(stop, 1) + len(stop)], repr(stop)
    absent = text[first] + "\x01"  # its first token is in the text, the whole is not: no stop at all
    assert main([*base, "--stop", absent]) == text
    widths = []  # a longer stop ends generation too, where it appears (it ran to --max_new_tokens and was cut)
    generate = HybridLM.generate
    monkeypatch.setattr(HybridLM, "generate", lambda *a, **k: widths.append(generate(*a, **k).shape[1]) or
                        generate(*a, **k))
    main([*base, "--stop", text[first:first + 2]])
    main([*base, "--stop", text[first:first + 2], "--no_stream"])
    assert len(widths) == 2 and widths[0] == widths[1] < 1 + 24  # (characters here are not bytes: the sample holds invalid ones)
    with pytest.raises(SystemExit, match=r"error: generate: top_p=2.0 must lie in \(0, 1\]"):
        main([*base, "--top_p", "2"])  # (a traceback before)


def test_generate_reads_the_prompt_with_the_tokenizer_the_run_trained(tmp_path, monkeypatch):
    """A run given ``--data.paths`` trains its BPE on those files: generate takes the run's data settings from its
    config.yaml, not the recipe file's (whose corpus gives another BPE: the prompt's ids were silently wrong)."""
    import json

    from recipes.data import TokenizedCorpus

    monkeypatch.chdir(tmp_path)
    words = "the cat sat on a mat while dogs ran far away".split()
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps({"text": " ".join(words[(i * j) % 11] for j in range(50))})
                                                 + "\n" for i in range(80)))
    data = ["--data.paths", "mine.jsonl", "--data.vocab_size", "300", "--data.cache_dir", "cache", "--data.seq_len", "32",
            "--data.batch_size", "4"]
    cli(["fit", "--config", "quickstart_bpe.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
         *data, "--trainer.max_steps", "3", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false"])
    text = main(["--config", "quickstart_bpe.yaml", "--ckpt_path", "last", "--prompt", "the cat", "--max_new_tokens", "6"])
    corpus = TokenizedCorpus("mine.jsonl", vocab_size=300, cache_dir="cache", seq_len=32, batch_size=4)
    model = LanguageModel.load_from_checkpoint(next(tmp_path.glob("runs/**/last.ckpt"))).model
    end = corpus.end_of_document
    ids = model.generate(torch.tensor([[end, *corpus.encode("the cat")]]), 6)  # (as every document began)
    assert text == corpus.decode(ids[0, 1:].tolist()) and end not in ids[0, 1:]

    # The corpus grows: its BPE, trained on the files as they are now, is another, and so would the prompt's ids be.
    checkpoint = next(tmp_path.glob("runs/**/last.ckpt"))
    caches = {json.loads(meta.read_text())["tokenizer_hash"] for meta in (tmp_path / "cache").glob("*/meta.json")}
    assert torch.load(checkpoint, weights_only=True)["tokenizer"] in caches  # the run's (the recipe's val_fraction)
    with open(tmp_path / "mine.jsonl", "a") as f:
        f.write("".join(json.dumps({"text": f"zebra{i} quagga{i} okapi{i} " * 9}) + "\n" for i in range(40)))
    mismatch = r"another tokenizer \(hash [0-9a-f]{12}\) than the data module gives \([0-9a-f]{12}, from the BPE trained"
    with pytest.raises(SystemExit, match=mismatch):
        main(["--config", "quickstart_bpe.yaml", "--ckpt_path", "last", "--prompt", "the cat", "--max_new_tokens", "6"])
    with pytest.raises(SystemExit, match=mismatch):  # a resumed run would train on the other tokens
        cli(["fit", "--config", "quickstart_bpe.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads",
             "2", *data, "--trainer.max_steps", "5", "--trainer.limit_val_batches", "0",
             "--trainer.enable_progress_bar", "false", "--ckpt_path", "last"])
    with pytest.raises(SystemExit, match=r"init_from=.*last.ckpt'?: the checkpoint was trained on text tokenized by another"):
        cli(["fit", "--config", "quickstart_bpe.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads",
             "2", *data, "--trainer.max_steps", "5", "--trainer.limit_val_batches", "0",
             "--trainer.enable_progress_bar", "false", "--model.init_from", str(checkpoint)])


def test_a_prompt_opens_a_document_and_its_continuation_ends_with_the_document(tmp_path, monkeypatch, capsys):
    """Every document the model trained on came after an end-of-document token: a prompt comes after one too
    (``--mid_document``: not), and the continuation ends where the model writes the next one, which generation stops
    at (``--past_document_end`` goes on). An empty prompt then asks for a whole document. (The model's tokens are
    scripted here: a 3-step model writes an end of document when it likes.)"""
    import json

    import components.generation as generation
    from components import HybridLM
    from recipes.data import TokenizedCorpus

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps({"text": f"the cat sat on mat {i} " * 4}) + "\n" for i in range(40)))
    data = ["--data.paths", "mine.jsonl", "--data.vocab_size", "300", "--data.cache_dir", "cache", "--data.seq_len", "16",
            "--data.batch_size", "4"]
    cli(["fit", "--config", "quickstart_bpe.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
         *data, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false"])
    corpus = TokenizedCorpus("mine.jsonl", vocab_size=300, cache_dir="cache", seq_len=16, batch_size=4)
    end, cat = corpus.end_of_document, corpus.encode("the cat")
    script = [*corpus.encode(" sat on"), end, *corpus.encode(" mat 7")]
    fed, sampled = [], []

    def scripted(logits, **settings):  # [B, V] -> [B]: the script's next token for every row
        sampled.append(len(sampled))
        return torch.full((logits.shape[0],), script[min(len(sampled) - 1, len(script) - 1)], dtype=torch.long)

    generate = HybridLM.generate

    def recorded(model, input_ids, *args, **kwargs):
        fed.append(input_ids.tolist())
        sampled.clear()
        return generate(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(generation, "sample_next", scripted)
    monkeypatch.setattr(HybridLM, "generate", recorded)
    base = ["--config", "quickstart_bpe.yaml", "--ckpt_path", "last", "--max_new_tokens", "12"]
    capsys.readouterr()
    k = script.index(end)
    text = main([*base, "--prompt", "the cat"])
    out, err = capsys.readouterr()
    assert fed[-1] == [[end, *cat]] and text == corpus.decode(cat + script[:k]) == out.rstrip("\n")
    assert len(sampled) == k + 1  # generation stopped at the end, not at --max_new_tokens
    assert f"(prompt 1: the model ended the document after {k} new tokens; --past_document_end goes on)" in err
    assert main([*base, "--prompt", "the cat", "--no_stream"]) == text
    assert main([*base, "--prompt", "the cat", "--mid_document"]) == text and fed[-1] == [cat]
    capsys.readouterr()
    past = main([*base, "--prompt", "the cat", "--past_document_end"])
    assert past == corpus.decode(cat + (script + [script[-1]] * 12)[:12]) and "<|endoftext|>" in past
    assert "ended the document" not in capsys.readouterr().err
    assert main([*base, "--prompt", ""]) == corpus.decode(script[:k]) and fed[-1] == [[end]]  # a new document
    with pytest.raises(SystemExit, match="error: prompt 1 is empty"):  # (nothing to continue)
        main([*base, "--prompt", "", "--mid_document"])
    both = main([*base, "--prompt", "the cat", "--prompt", "sat"])
    assert both == f"==> prompt 1 <==\n{text}\n\n==> prompt 2 <==\n{corpus.decode(corpus.encode('sat') + script[:k])}"
    sat = corpus.encode("sat")
    assert fed[-1][0][-len(cat) - 1:] == [end, *cat] and fed[-1][1][-len(sat) - 1:] == [end, *sat]


def test_generate_without_a_checkpoint_is_a_named_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="--ckpt_path last: no last.ckpt under runs/quickstart"):
        main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "x"])


def test_generate_takes_the_threads_given_and_says_so_beside_the_text(tmp_path, monkeypatch, capsys):
    """``--threads N`` (else the cores other processes leave free, as for ``fit``), said on stderr: stdout is the
    text alone; ``--device`` is checked before anything loads."""
    monkeypatch.chdir(tmp_path)
    cli(["fit", *TINY, "--trainer.max_steps", "2"])
    capsys.readouterr()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        text = main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "ab", "--max_new_tokens", "3",
                     "--threads", "1", "--device", "cpu"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    said = capsys.readouterr()
    threads, *notes = said.err.splitlines()  # (the notes: the run's width is TINY's flag, not the recipe's)
    assert said.out == text + "\n" and threads == "torch threads: 1 (--threads)"
    assert [note[:70] for note in notes] == ["note: --ckpt_path last: no last.ckpt there is of the model this recipe"]
    with pytest.raises(SystemExit):
        main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "ab", "--threads", "0"])
    assert "argument --threads: 0 must be >= 1" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "ab", "--device", "cuda"])
        assert "argument --device: cuda: CUDA is not available here" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_generate_on_cuda_continues_as_on_the_cpu(tmp_path, monkeypatch):
    """``--device cuda``: the model, the prompt and the sampling generator on the GPU; greedy text as on the CPU
    (a tiny fp32 model: the argmax does not turn on the devices' rounding), a seeded draw repeatable there."""
    monkeypatch.chdir(tmp_path)
    cli(["fit", *TINY, "--trainer.max_steps", "5"])
    common = ["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "def ", "--max_new_tokens", "16"]
    assert main([*common, "--device", "cuda"]) == main([*common, "--device", "cpu"])
    sampled = [*common, "--device", "cuda", "--temperature", "1.0", "--seed", "4", "--stop", "e"]
    assert main(sampled) == main(sampled)


def test_bytes_round_trip():
    assert TextCorpus.decode(TextCorpus.encode("naïve ✓")) == "naïve ✓"


OWN_MIXER = '''
import torch
from torch import nn


class CausalConv(nn.Module):
    """A depthwise causal convolution that ignores the decoding cache: trains, cannot decode."""

    def __init__(self, d_model, *, width=3):
        super().__init__()
        self.d_model = d_model
        self.conv = nn.Conv1d(d_model, d_model, width, groups=d_model, padding=width - 1)

    def forward(self, x, context=None):
        return self.conv(x.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2)
'''


def test_a_recipes_own_mixer_is_trusted_and_one_without_decoding_state_generates_by_recomputing(
        tmp_path, monkeypatch, capsys):
    """generate and eval read a checkpoint of the recipe's own classes as fit and validate do (they refused it, asking
    for --allow_classes); a mixer that keeps no decoding state generates by recomputing the sequence at each token
    (it was refused, and its runs logged no samples), with a warning that names it; compiled, it is refused."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from recipes.evaluation.cli import main as evaluate

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ownmix.py").write_text(OWN_MIXER)
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("model:\n  d_model: 32\n  pattern: 'CM AM'\n  mixers:\n"
                      "    C: {class_path: ownmix.CausalConv, init_args: {width: 3}}\n"
                      "    A: {class_path: components.QCAttention, init_args: {n_heads: 2}}\n"
                      "data:\n  class_path: recipes.data.TextCorpus\n  init_args: {seq_len: 32, batch_size: 4}\n"
                      "trainer:\n  max_steps: 4\n  val_check_interval: 2\n  limit_val_batches: 1\n"
                      "  enable_progress_bar: false\n")
    with pytest.warns(UserWarning, match="block 0's sequence mixer CausalConv keeps no decoding state"):
        cli(["fit", "--config", str(recipe)])
    [run] = tmp_path.glob("lightning_logs/version_0")
    events = EventAccumulator(str(run))
    events.Reload()
    assert [e.step for e in events.Tensors("samples/text_summary")] == [2, 4]  # each validation's sample
    with pytest.warns(UserWarning, match="CausalConv keeps no decoding state in context.cache: each new token recomput"):
        text = main(["--config", str(recipe), "--ckpt_path", "last", "--prompt", "ab", "--max_new_tokens", "4"])
    assert text.startswith("ab") and len(text.encode()) >= 4
    with pytest.raises(SystemExit, match=r"block 0's sequence mixer CausalConv keeps no decoding state .* no step to "
                                         "compile"):
        main(["--config", str(recipe), "--ckpt_path", "last", "--prompt", "ab", "--max_new_tokens", "4", "--compile"])
    evaluate(["--config", str(recipe), "--ckpt_path", "last", "--suite", "length", "--multiples", "1", "--windows", "2"])
    assert "| plain | 32 |" in capsys.readouterr().out


def test_a_run_fit_from_several_configs_is_read_from_the_same_several(tmp_path, monkeypatch, capsys):
    """``fit --config quickstart.yaml --config mine.yaml`` merges the files; generate, eval and ``hf export`` given the
    same two merged them too. They read the last alone: its checkpoint was looked for under ``runs/mine`` (where the
    run is not: its logger is quickstart's), and a model read without the first file's settings."""
    from recipes.evaluation.cli import main as evaluate
    from recipes.hf.cli import main as hf
    from recipes.runs import load_recipe

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ownmix.py").write_text(OWN_MIXER)
    (tmp_path / "mine.yaml").write_text(
        "model:\n  d_model: 32\n  pattern: 'CM AM'\n  mixers:\n    C: {class_path: ownmix.CausalConv}\n"
        "    A: {class_path: components.QCAttention, init_args: {n_heads: 2}}\n"
        "data:\n  init_args: {seq_len: 32, batch_size: 4}\ntrainer:\n  max_steps: 3\n  limit_val_batches: 0\n"
        "  enable_progress_bar: false\n")
    configs = ["--config", "quickstart.yaml", "--config", "mine.yaml"]
    cli(["fit", *configs])
    [checkpoint] = tmp_path.glob("runs/quickstart/version_0/checkpoints/last.ckpt")
    recipe = load_recipe(["quickstart.yaml", "mine.yaml"])
    assert recipe["model"]["pattern"] == "CM AM" and recipe["model"]["lr"] == load_recipe("quickstart.yaml")["model"]["lr"]
    assert recipe["trainer"]["max_steps"] == 3 and recipe["data"]["init_args"]["seq_len"] == 32
    capsys.readouterr()
    with pytest.warns(UserWarning, match="keeps no decoding state") as said:
        text = main([*configs, "--ckpt_path", "last", "--prompt", "ab", "--max_new_tokens", "4"])
    assert not [w for w in said if "args parameter" in str(w.message)]  # (Lightning's, on the tool's own sys.argv)
    model = LanguageModel.load_from_checkpoint(checkpoint, allow_classes=["ownmix"]).model
    with pytest.warns(UserWarning, match="keeps no decoding state"):
        assert text == TextCorpus.decode(model.generate(torch.tensor([TextCorpus.encode("ab")]), 4)[0].tolist())
    evaluate([*configs, "--ckpt_path", "last", "--suite", "length", "--multiples", "1", "--windows", "2"])
    assert "| plain | 32 |" in capsys.readouterr().out
    # (read: the export's own refusal)
    with pytest.raises(SystemExit, match=r"pattern 'CM AM'\) has no Hugging Face class"):
        hf(["export", *configs, "--ckpt_path", "last", "--out", str(tmp_path / "hf")])
    with pytest.raises(SystemExit, match=r"no last.ckpt under lightning_logs/\*/checkpoints/ or runs/mine/"):
        main(["--config", "mine.yaml", "--ckpt_path", "last", "--prompt", "ab"])  # (the second file alone names no run)


def test_generate_for_a_synthetic_task_points_to_its_suite(monkeypatch):
    from recipes.runs import data_module, text_tokenizer

    recipe = {"data": {"class_path": "recipes.data.MQAR", "init_args": {"seq_len": 16, "num_pairs": 2, "vocab_size": 64}}}
    with pytest.raises(ValueError, match=r"generate needs text, and the recipe's data module MQAR has no text tokenizer "
                                         r"\(encode/decode\): a synthetic task's model is scored by its suite "
                                         r"\(`python -m recipes eval --suite mqar`\)"):
        text_tokenizer(data_module(recipe, text_only=True), "generate")
    import recipes.runs  # and the command says so, one line, before any prompt is encoded

    run = recipes.runs.LoadedRun(None, data_module(recipe, text_only=True), None, recipe)
    monkeypatch.setattr(recipes.runs, "load_run", lambda *args, **kwargs: run)
    with pytest.raises(SystemExit, match="error: generate needs text, and the recipe's data module MQAR"):
        main(["--config", "mqar/qcattn.yaml", "--ckpt_path", "last", "--prompt", "ab"])


def test_a_data_module_that_encodes_but_cannot_decode_is_no_tokenizer():
    import types

    from recipes.runs import text_tokenizer

    with pytest.raises(ValueError, match="the recipe's data module SimpleNamespace has no text tokenizer"):
        text_tokenizer(types.SimpleNamespace(encode=list), "generate")
    decodes = types.SimpleNamespace(encode=list, decode=list)
    assert text_tokenizer(decodes, "generate") is decodes


def test_the_continuation_is_cut_after_the_first_stop_at_or_after_the_prompt():
    from recipes.generate import cut_after, finished_text

    assert cut_after("ab.cd.ef", ".", start=3) == "ab.cd."  # the prompt's own "." does not count
    assert cut_after(".x.y", ".") == "."  # found at the very start (an empty prompt)
    assert cut_after("abc", "z") == "abc" and cut_after("abc", None) == "abc"
    assert finished_text("ab\ufffd\ufffd") == "ab" and finished_text("a\ufffdb") == "a\ufffdb"


@pytest.mark.parametrize("missing", ["--config", "--ckpt_path", "--prompt"])
def test_each_required_flag_is_named_when_missing(missing, capsys):
    flags = {"--config": "quickstart.yaml", "--ckpt_path": "last", "--prompt": "x"}
    with pytest.raises(SystemExit):
        main([part for flag, value in flags.items() if flag != missing for part in (flag, value)])
    said = ("one of the arguments --prompt --prompt_file is required" if missing == "--prompt"
            else f"the following arguments are required: {missing}")
    assert said in capsys.readouterr().err


def test_several_prompts_decode_as_one_batch_each_as_it_would_alone(tmp_path, monkeypatch, capsys):
    """``--prompt`` and ``--prompt_file`` repeat, in the order given: the prompts go through ``generate`` as one
    left-padded batch, and each greedy continuation is the one that prompt gets alone (a 2-step model: its greedy
    text still varies with the prompt), printed under ``==> prompt N <==``."""
    import io

    monkeypatch.chdir(tmp_path)
    cli(["fit", *TINY, "--trainer.max_steps", "2"])
    (tmp_path / "p.txt").write_text("import os\n")
    common = ["--config", "quickstart.yaml", "--ckpt_path", "last", "--max_new_tokens", "10"]
    alone = [main([*common, "--prompt", text]) for text in ("def é", "import os\n", "x")]
    assert len(set(alone)) == 3 and all(len(text) > 8 for text in alone)
    monkeypatch.setattr("sys.stdin", io.StringIO("x"))
    batches = []
    generate = HybridLM.generate
    monkeypatch.setattr(HybridLM, "generate", lambda self, ids, *a, **k: batches.append(
        (ids.shape, k["padding_mask"].sum(1).tolist())) or generate(self, ids, *a, **k))
    capsys.readouterr()
    printed = main([*common, "--prompt", "def é", "--prompt_file", "p.txt", "--prompt_file", "-"])
    assert printed == "\n\n".join(f"==> prompt {n} <==\n{text}" for n, text in enumerate(alone, 1))
    assert capsys.readouterr().out == printed + "\n"
    assert batches == [((3, 10), [4, 0, 9])]  # one call; "def é" is 6 bytes, "import os\n" 10, "x" 1
    # a stop per prompt: each continuation cut after its own first stop
    stopped = main([*common, "--prompt", "def é", "--prompt", "x", "--stop", alone[2][3:5]])
    assert stopped.split("\n\n")[1] == "==> prompt 2 <==\n" + alone[2][:5]


def test_a_bad_prompt_or_stop_is_named(tmp_path, monkeypatch, capsys):
    import io

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    common = ["--config", "quickstart.yaml", "--ckpt_path", "last"]
    for argv, said in [(["--prompt_file", "nowhere.txt"], "argument --prompt_file: no such file: nowhere.txt"),
                       (["--prompt_file", "."], "argument --prompt_file: .: not a UTF-8 text file (IsADirectoryError)"),
                       (["--prompt", "x", "--stop", ""], "argument --stop: an empty text"),
                       # bytes no UTF-8 text has, as Python hands them on from a Latin-1 shell (a traceback before)
                       (["--prompt", "ab\udcff"], "argument --prompt: not UTF-8 text: byte 0xff at character 2"),
                       (["--prompt", "x", "--stop", "\udce9t\udce9"], "argument --stop: not UTF-8 text: byte 0xe9 at "
                                                                        "character 0"),
                       (["--prompt_file", "-"], "argument --prompt_file: stdin: not UTF-8 text: byte 0xfe at character 1")]:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a\xfe"), encoding="utf-8",
                                                          errors="surrogateescape"))  # (a C locale's stdin)
        with pytest.raises(SystemExit):
            main([*common, *argv])
        assert said in capsys.readouterr().err, argv
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a\xfe"), encoding="utf-8"))  # (a UTF-8 locale's)
    with pytest.raises(SystemExit):
        main([*common, "--prompt_file", "-"])
    assert ("argument --prompt_file: stdin: not UTF-8 text (invalid start byte at byte 1)"
            in capsys.readouterr().err)
    cli(["fit", *TINY, "--trainer.max_steps", "1"])
    with pytest.raises(SystemExit, match="error: prompt 2 is empty; give at least one token"):
        main([*common, "--prompt", "x", "--prompt_file", "empty.txt"])
    # past the model's max_seq_len (512): refused before any work, pointing to --extrapolate, which takes it there
    with pytest.raises(SystemExit, match=r"520 positions, past max_seq_len=512; .* the generate command's --extrapolate"):
        main([*common, "--prompt", "x", "--max_new_tokens", "520", "--no_stream"])
    text = main([*common, "--prompt", "x", "--max_new_tokens", "520", "--no_stream", "--extrapolate"])
    assert text.startswith("x") and len(text.encode("utf-8", "surrogateescape")) >= 400  # (bytes: a few invalid)


def test_one_prompts_text_is_written_as_its_tokens_come_and_ends_as_printed_whole(tmp_path, monkeypatch):
    """One prompt streams: the text is written in pieces during generation, never a character the next tokens may
    finish into another nor past the stop text, and the pieces add up to what ``--no_stream`` prints at the end."""
    import io

    monkeypatch.chdir(tmp_path)
    cli(["fit", *TINY, "--trainer.max_steps", "2"])
    base = ["--config", "quickstart.yaml", "--ckpt_path", "last", "--prompt", "a", "--max_new_tokens", "24",
            "--temperature", "1.0", "--seed", "3"]

    class Pieces(io.StringIO):
        def write(self, text):
            pieces.append((text, steps[0]))
            return super().write(text)

    steps = [0]  # generate's step when a piece was written
    generate = HybridLM.generate
    monkeypatch.setattr(HybridLM, "generate", lambda self, ids, n, **k: generate(self, ids, n, **{
        **k, "stop_when": (lambda new: steps.__setitem__(0, new.shape[1]) or k["stop_when"](new))
        if k["stop_when"] else None}))
    whole = main([*base, "--no_stream"])
    first = next(k for k in range(2, len(whole)) if whole[k].isascii() and whole[k] not in whole[1:k])
    for stop in ([], ["--stop", whole[first]], ["--stop", whole[first:first + 2]]):
        expected = main([*base, "--no_stream", *stop])
        pieces = []
        monkeypatch.setattr("sys.stdout", Pieces())
        text = main([*base, *stop])
        assert text == expected, stop
        assert "".join(piece for piece, _ in pieces) == text + "\n"
        written_at = [step for _, step in pieces]  # (this model's sampled bytes are often unfinished characters)
        assert written_at[0] == 1 and written_at[-1] == steps[0] and len(set(written_at)) >= (2 if stop else 6), pieces
        assert not any("\ufffd" in piece for piece, _ in pieces[:-1]) or "\ufffd" in text

    from recipes.generate import TextStream

    out = io.StringIO()  # bytes: "é" is two tokens; the first alone decodes to a replacement character
    stream = TextStream(TextCorpus.decode, TextCorpus.encode("é!x"), stop="é!", out=out)  # (the prompt's stop: none)
    written = []
    for new in ([], TextCorpus.encode("é")[:1], TextCorpus.encode("é"), TextCorpus.encode("é!é!z")):
        stream.update(new)
        written.append(out.getvalue())
    assert written == ["é!x", "é!x", "é!xé", "é!xé!"]
    stream.finish("é!xé!")
    assert out.getvalue() == "é!xé!\n"
    merged = TextStream(lambda ids: "".join(map(str, ids)) if len(ids) < 3 else "rewritten", [1], None, out=io.StringIO())
    merged.update([2])
    merged.update([2, 3])  # a tokenizer that decodes the longer sequence to other text: nothing written over "12"
    merged.finish("rewritten")
    assert merged.out.getvalue() == "12\n[the text as decoded at the end:]\nrewritten\n"
