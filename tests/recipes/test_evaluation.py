"""``python -m recipes eval``: the lm-eval adapter against the model's own log-softmax written out (never
against itself), the local tasks through the real harness, the long-context suites against hand
computations, and the errors a user meets."""

import json
import math
import re
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from components import HybridLM
from recipes.data.text import TextCorpus
from recipes.evaluation.suites import length_suite, passkey_suite, scalars, table

lm_eval = pytest.importorskip("lm_eval", reason="the harness tests need `pip install -e .[dev]` (lm-eval)")
from lm_eval.api.instance import Instance  # noqa: E402

from recipes.evaluation.harness import ZooLM  # noqa: E402

BYTES = TextCorpus  # encode/decode are bytes


def tiny(pattern: str = "SM AM", max_seq_len: int = 64) -> HybridLM:
    torch.manual_seed(0)
    from functools import partial

    from components import SSD, QCAttention

    model = HybridLM(256, 32, pattern, {"S": partial(SSD, d_state=8, chunk_size=4), "A": partial(QCAttention, n_heads=2)},
                     max_seq_len=max_seq_len)
    return model.eval()


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def written_out(model, context: str, continuation: str, max_length: int) -> tuple[float, bool]:
    """lm-eval's rule for a causal model, written out: trailing spaces of the context move to the
    continuation; the continuation's tokens are those of the whole text after the context's; the input is
    cut from the left to max_length; the score is the sum of the model's log-softmax at the continuation."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, head = BYTES.encode(context + continuation), BYTES.encode(context)
    target = whole[len(head):]
    ids = whole[-(max_length + 1):][:-1]
    with torch.no_grad():
        logprobs = F.log_softmax(model(torch.tensor([ids]))[0], dim=-1)[-len(target):]  # [n, V]
    picked = logprobs[torch.arange(len(target)), torch.tensor(target)]
    return float(picked.sum()), bool((logprobs.argmax(-1) == torch.tensor(target)).all())


PAIRS = [("The cat sat on the ", "mat."), ("The cat sat on the", " hat"), ("The cat sat on the", " mat and slept"),
         ("Question: what is 2 + 2? Answer:", " 4"), ("x" * 90, " long context cut from the left"),
         ("Question: what is 2 + 2? Answer:", " four"), ("A", "B")]


@pytest.mark.parametrize("batch_size, padding_side, reuse", [(1, "right", False), (4, "right", False),
                                                             (3, "left", False), (4, "right", True), (2, "left", True)])
def test_loglikelihood_is_the_models_own_log_softmax(batch_size, padding_side, reuse):
    model = tiny()
    lm = ZooLM(model, BYTES, batch_size=batch_size, padding_side=padding_side, reuse_context=reuse, max_length=48)
    got = lm.loglikelihood([request("loglikelihood", c, k) for c, k in PAIRS])
    for (context, continuation), (score, greedy) in zip(PAIRS, got):
        want, want_greedy = written_out(model, context, continuation, 48)
        assert score == pytest.approx(want, abs=2e-4), (context, continuation)
        assert greedy == want_greedy
    assert (lm.requests_seen, lm.requests_cut) == (len(PAIRS), 1)  # the 90 x's: what the command's note counts


def test_choices_share_their_context_while_the_whole_fits_the_model(monkeypatch):
    """The input is the context and continuation but the last token, so a whole of ``max_length + 1`` tokens fits and
    its choices are scored from one pass over their context; one token longer, the input is cut from the left and each
    choice is scored plainly — and every score is the model's own either way."""
    import recipes.evaluation.harness as harness

    model, shared_calls = tiny(), []
    real = harness.score_shared
    monkeypatch.setattr(harness, "score_shared", lambda *a: shared_calls.append(a) or real(*a))
    lm = ZooLM(model, BYTES, max_length=16)
    for context, shared in (("c" * 14, True), ("c" * 15, False)):  # with a choice of 3 tokens: 17 or 18 in all
        shared_calls.clear()
        requests = [(None, BYTES.encode(context), BYTES.encode(choice)) for choice in (" ab", " cd")]
        got = lm._loglikelihood_tokens(requests, disable_tqdm=True)
        assert len(shared_calls) == shared, context
        for choice, (score, greedy) in zip((" ab", " cd"), got):
            want, want_greedy = written_out(model, context, choice, 16)
            assert score == pytest.approx(want, abs=2e-4) and greedy == want_greedy


def test_is_greedy_when_the_continuation_is_the_argmax():
    model = tiny()
    prompt = BYTES.encode("Some text and ")
    with torch.no_grad():
        greedy = model.generate(torch.tensor([prompt]), 3)[0, len(prompt):].tolist()
    other = [(greedy[0] + 1) % 256, *greedy[1:]]
    for reuse in (True, False):
        lm = ZooLM(model, BYTES, reuse_context=reuse)
        results = lm._loglikelihood_tokens([(None, prompt, greedy), (None, prompt, other)], disable_tqdm=True)
        assert [greedy_flag for _, greedy_flag in results] == [True, False]


def test_an_empty_context_is_the_prefix_token():
    model = tiny()
    lm = ZooLM(model, BYTES, prefix_token=10)
    [(score, _)] = lm.loglikelihood([request("loglikelihood", "", "Hello")])
    with torch.no_grad():
        logprobs = F.log_softmax(model(torch.tensor([[10, *BYTES.encode("Hell")]]))[0], dim=-1)
    assert score == pytest.approx(float(logprobs[torch.arange(5), torch.tensor(BYTES.encode("Hello"))].sum()), abs=1e-4)


def test_the_adapters_defaults_refusals_shared_contexts_and_lm_evals_cache(monkeypatch):
    """An empty continuation scores (0, greedy); choices of one context go through one shared pass (and never with
    ``reuse_context=False``); every keyed result reaches lm-eval's cache hook; the prefix token defaults to the
    tokenizer's end of document, else its newline; a bad padding side or batch size is refused by name."""
    import recipes.evaluation.harness as harness

    model = tiny()
    with pytest.raises(ValueError, match=r"padding_side='center' is not 'left' or 'right'"):
        ZooLM(model, BYTES, padding_side="center")
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match=rf"batch_size={bad!r} must be a positive integer"):
            ZooLM(model, BYTES, batch_size=bad)
    assert ZooLM(model, BYTES).eot_token_id == 10 and ZooLM(model, BYTES).reuse_context  # bytes: the newline

    class Documents:
        end_of_document = 7
        encode, decode = staticmethod(BYTES.encode), staticmethod(BYTES.decode)

    assert ZooLM(model, Documents()).eot_token_id == 7
    assert ZooLM(model, BYTES).device == model.embedding.weight.device

    shared_calls = []
    real = harness.score_shared
    monkeypatch.setattr(harness, "score_shared", lambda *a: shared_calls.append(a) or real(*a))
    context = BYTES.encode("Pick one: ")
    requests = [(("ctx", "a"), context, BYTES.encode("a")), (("ctx", "b"), context, BYTES.encode("b")),
                (None, context, []), (("other", "c"), BYTES.encode("Alone"), BYTES.encode("c"))]
    cached = []
    for reuse in (True, False):
        lm = ZooLM(model, BYTES, reuse_context=reuse)
        lm.cache_hook = type("Hook", (), {"add_partial": lambda self, *entry: cached.append(entry)})()
        shared_calls.clear(), cached.clear()
        results = lm._loglikelihood_tokens(requests, disable_tqdm=True)
        assert results[2] == (0.0, True)  # nothing to score
        # the two choices of one context: one pass over it; a context with one continuation is scored plainly
        assert [call[1:] for call in shared_calls] == ([([context], [[[97], [98]]])] if reuse else [])
        assert [(kind, key) for kind, key, _ in cached] == [("loglikelihood", ("ctx", "a")),
                                                           ("loglikelihood", ("ctx", "b")),
                                                           ("loglikelihood", ("other", "c"))]  # not the unkeyed one
        assert [result for *_, result in cached] == [results[0], results[1], results[3]]


def test_rolling_loglikelihood_is_the_validation_loss_times_the_tokens():
    from recipes import LanguageModel

    lm_module = LanguageModel(32, "SM AM", {"S": {"class_path": "components.SSD", "init_args": {"d_state": 8, "chunk_size": 4}},
                                            "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}},
                              vocab_size=256, max_seq_len=64).eval()
    data = TextCorpus(seq_len=40, batch_size=1)
    window = data.validation_tokens()[:41]  # one validation window: 40 inputs, 40 labels
    ce, _, _ = lm_module.forward_loss({"input_ids": window[None, :-1], "labels": window[None, 1:]})
    text = BYTES.decode(window[1:].tolist())
    lm = ZooLM(lm_module.model, BYTES, prefix_token=int(window[0]), max_length=64)
    [total] = lm.loglikelihood_rolling([request("loglikelihood_rolling", text)])
    assert -total == pytest.approx(float(ce.detach()) * 40, rel=1e-5)
    # longer than max_length: lm-eval's disjoint windows, each scored from its own context
    long = BYTES.decode(data.validation_tokens()[:150].tolist())
    short = ZooLM(lm_module.model, BYTES, prefix_token=10, max_length=32)
    [rolled] = short.loglikelihood_rolling([request("loglikelihood_rolling", long)])
    tokens, expected = BYTES.encode(long), 0.0
    # lm-eval's windows written out: the first predicts 32 tokens after the prefix token; each next one
    # predicts the next 32 (or what is left) from the 32 tokens before its last prediction
    windows = [([10] + tokens[:31], tokens[:32])]
    windows += [(tokens[min(p + 32, len(tokens)) - 33:min(p + 32, len(tokens)) - 1], tokens[p:p + 32])
                for p in range(32, len(tokens), 32)]
    with torch.no_grad():
        for inputs, targets in windows:
            logprobs = F.log_softmax(lm_module.model(torch.tensor([inputs]))[0], dim=-1)[-len(targets):]
            expected += float(logprobs[torch.arange(len(targets)), torch.tensor(targets)].sum())
    assert rolled == pytest.approx(expected, rel=1e-5)


def test_generate_until_is_generate_cut_at_the_first_stop_string():
    model = tiny()
    lm = ZooLM(model, BYTES)
    prompt = "Once upon a time"
    with torch.no_grad():
        ids = model.generate(torch.tensor([BYTES.encode(prompt)]), 20)[0, len(prompt):].tolist()
    full = BYTES.decode(ids)
    stop = full[5:7]  # a string the greedy text contains
    [got] = lm.generate_until([request("generate_until", prompt, {"until": [stop, "zzz"], "max_gen_toks": 20})])
    assert got == full.split(stop)[0] and len(got) <= 5
    [whole] = lm.generate_until([request("generate_until", prompt, {"until": ["zzz"], "max_gen_toks": 20})])
    assert whole == full
    assert (lm.requests_seen, lm.requests_cut) == (2, 0)
    # a context longer than the model takes beside its budget is cut from the left, and counted
    lm.generate_until([request("generate_until", prompt, {"until": ["zzz"], "max_gen_toks": lm.max_length - 15})])
    lm.generate_until([request("generate_until", prompt, {"until": ["zzz"], "max_gen_toks": lm.max_length - 16})])
    assert (lm.requests_seen, lm.requests_cut) == (4, 1)
    # a budget no context fits beside: named with the flag that lowers it (it was generate's own refusal, which
    # pointed to the generate command's --extrapolate)
    with pytest.raises(ValueError, match=r"a budget of 65 new tokens \(max_gen_toks\) is more than the model's "
                                         r"max_seq_len=64 .* --gen_kwargs max_gen_toks=N"):
        lm.generate_until([request("generate_until", prompt, {"until": ["zzz"], "max_gen_toks": 65})])
    [alone] = lm.generate_until([request("generate_until", prompt, {"until": ["zzz"], "max_gen_toks": 64})])
    assert alone  # (the budget of max_seq_len itself fits after the context's last token)


class BytesWithAnEnd:
    """Bytes, with one byte id standing for the end of a document (decoded as ``<|endoftext|>``)."""

    def __init__(self, end: int):
        self.end_of_document = end

    encode = staticmethod(BYTES.encode)

    def decode(self, ids: list[int]) -> str:
        pieces, piece = [], []
        for i in ids:
            if i == self.end_of_document:
                pieces += [BYTES.decode(piece), "<|endoftext|>"]
                piece = []
            else:
                piece.append(i)
        return "".join(pieces + [BYTES.decode(piece)])


def test_generate_until_also_stops_at_the_end_of_document_as_lm_evals_hugging_face_model_does():
    """lm-eval's Hugging Face model adds its end-of-text token to every task's stop strings; the zoo's stopped there
    only for a task without any, so a continuation ran on into the next document. A byte tokenizer has no end of
    document: its empty context, a newline, is not made a stop."""
    model = tiny()
    prompt = "Once upon a time"
    with torch.no_grad():
        ids = model.generate(torch.tensor([BYTES.encode(prompt)]), 20)[0, len(prompt):].tolist()
    end = ids[1]  # a byte the greedy continuation holds (not first), standing for the end of a document
    tokenizer = BytesWithAnEnd(end)
    lm = ZooLM(model, tokenizer)
    [got] = lm.generate_until([request("generate_until", prompt, {"until": ["zzz"], "max_gen_toks": 20})])
    assert got == tokenizer.decode(ids[:ids.index(end)]) and 0 < len(got) < 10
    assert lm.prefix_token_id == end  # the end of a document opens the next: an empty context
    tokenizer.start_of_document = end  # (as a TokenizedCorpus without a start token of its own says)
    assert ZooLM(model, tokenizer).tok_encode("ab") == BYTES.encode("ab")  # a context is its own text
    tokenizer.start_of_document = 7  # a corpus with a start-of-document token of its own (an imported Llama's <s>)
    assert ZooLM(model, tokenizer).prefix_token_id == 7 and ZooLM(model, tokenizer).tok_encode("ab") == [7, 97, 98]
    # bytes: no end of document, and the newline that is their empty context is no stop
    lines = torch.tensor([BYTES.encode(prompt) + list(b"A\nB\n")])
    model.generate = lambda *args, **kwargs: lines
    [plain] = ZooLM(model, BYTES).generate_until([request("generate_until", prompt, {"until": ["zzz"], "max_gen_toks": 4})])
    assert plain == "A\nB\n"


@pytest.mark.parametrize("pattern", ["SM AM", "AM"])
def test_generate_until_in_batches_is_each_request_alone_and_stops_once_every_one_has_its_stop(pattern):
    """Batched (left-padded contexts of different lengths, each its own stop strings) equals each request generated
    alone to its whole budget and cut; and the batch ends at the step where its last continuation met its stop, not at
    the budget (every request ran to max_gen_toks before: 256 tokens by default for a one-word answer)."""
    model = tiny(pattern, max_seq_len=96)
    contexts = ["Once upon a time", "A", "The quick brown fox jumps over", "Hello, world", "xyz" * 9]
    alone, alone_ids = [], []
    for context in contexts:
        ids = torch.tensor([BYTES.encode(context)])
        with torch.no_grad():
            alone_ids.append(model.generate(ids, 40)[0, ids.shape[1]:].tolist())
        alone.append(BYTES.decode(alone_ids[-1]))
    stops = [[text[3 + i:5 + i], "zzz"] for i, text in enumerate(alone)]  # each met 5-9 characters in
    stops[1] = ["zzz"]  # one that never stops: the whole budget
    widths = []
    generate = model.generate

    def recorded(*args, **kwargs):
        out = generate(*args, **kwargs)
        widths.append(out.shape[1] - args[0].shape[1])
        return out

    model.generate = recorded
    lm = ZooLM(model, BYTES, batch_size=3)
    got = lm.generate_until([request("generate_until", c, {"until": u, "max_gen_toks": 40}) for c, u in zip(contexts, stops)])
    assert got == [text.split(u[0])[0] for text, u in zip(alone, stops)]
    assert all(len(text) < 9 for i, text in enumerate(got) if i != 1) and got[1] == alone[1]
    assert 40 in widths  # the batch that held the one without a stop ran to the budget
    widths.clear()
    short = lm.generate_until([request("generate_until", c, {"until": u, "max_gen_toks": 40})
                               for c, u in zip(contexts, stops) if u != ["zzz"]])
    assert short == [g for g, u in zip(got, stops) if u != ["zzz"]]
    assert max(widths) <= max(len(BYTES.encode(text[:5 + i])) for i, text in enumerate(alone) if i != 1) < 40
    mixed = lm.generate_until([request("generate_until", contexts[0], {"until": ["zzz"], "max_gen_toks": 7}),
                               request("generate_until", contexts[2], {"until": ["zzz"], "max_gen_toks": 40})])
    assert mixed == [BYTES.decode(alone_ids[0][:7]), alone[2]]  # each its own budget


def test_generate_until_samples_with_the_tasks_top_k_and_top_p_and_refuses_a_setting_it_lacks(monkeypatch):
    """A task's ``top_k``/``top_p`` were dropped (plain temperature sampling scored instead), and a setting the zoo's
    generate lacks (beam search) was ignored: the task's decoding was not the one scored, without a word."""
    model = tiny()
    seen = []
    generate = model.generate
    model.generate = lambda *args, **kwargs: seen.append({k: kwargs[k] for k in ("temperature", "top_k", "top_p")}) \
        or generate(*args, **kwargs)
    lm = ZooLM(model, BYTES, batch_size=4)
    ask = lambda **kw: request("generate_until", "Once upon", {"until": ["zzz"], "max_gen_toks": 4, **kw})  # noqa: E731
    lm.generate_until([ask(do_sample=True, temperature=0.7, top_k=5, top_p=0.9), ask(temperature=0.7, top_k=5),
                       ask(do_sample=True, temperature=0.0), ask(num_beams=1, repetition_penalty=1.0)])
    assert sorted(seen, key=repr) == [{"temperature": 0.0, "top_k": None, "top_p": None},  # greedy, one batch of 3
                                      {"temperature": 0.7, "top_k": 5, "top_p": 0.9}]
    with pytest.raises(ValueError, match=r"generate_until: the task asks for num_beams=4, which the zoo's generate "
                                         r"does not do \(it takes until, max_gen_toks, do_sample, temperature, top_k"):
        lm.generate_until([ask(num_beams=4)])


def test_a_stop_string_is_not_found_in_a_character_the_next_tokens_have_not_finished(monkeypatch):
    """Bytes of an unfinished character decode to a replacement character: "ab" + the first byte of "é" reads
    "ab\ufffd" until the next byte makes it "abé". A stop string found across it ("b\ufffd") ended the continuation
    there, so a batch that stopped early answered otherwise than one that ran on (texts that hold one: an untrained
    byte model's)."""
    import components.generation as generation

    script = list("abécd".encode())  # [97, 98, 195, 169, 99, 100]
    steps = iter(range(100))
    monkeypatch.setattr(generation, "sample_next", lambda logits, **_: torch.full(
        (logits.shape[0],), script[min(next(steps), len(script) - 1)], dtype=torch.long))
    lm = ZooLM(tiny(), BYTES)
    [got] = lm.generate_until([request("generate_until", "x", {"until": ["b\ufffd", "d"], "max_gen_toks": 8})])
    assert got == "abéc"


def run_task(model, tmp_path, name: str, items: list[dict]) -> float:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from recipes.evaluation.tasks import write_task

    folder = write_task(tmp_path / name, name, items)
    results = simple_evaluate(model=ZooLM(model, BYTES, batch_size=4), tasks=[name], log_samples=False, bootstrap_iters=0,
                              task_manager=TaskManager(include_path=str(folder), include_defaults=False))
    return results["results"][name]["acc,none"]


def test_tasks_of_the_zoos_folders_alone_skip_the_harnesss_index_and_any_other_name_takes_it(tmp_path, monkeypatch):
    """The harness's own ~14K task YAMLs take ~10 s to index: where every name is a task of the zoo's folder or of an
    --include_path, the TaskManager indexes those folders alone (and is kept for the next evaluation); a group (whose
    members may be the harness's), a hub task's name or an unknown one needs the whole index."""
    import lm_eval.tasks

    from recipes.evaluation.cli import check_tasks
    from recipes.evaluation.tasks import task_folder, write_task

    asked = []

    class Recorded(lm_eval.tasks.TaskManager):
        def __init__(self, *args, include_defaults=True, **kwargs):
            asked.append(include_defaults)  # the folders alone stand in for the whole index (its 10 s are not this test's)
            super().__init__(*args, include_defaults=False, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Recorded)
    mine = write_task(tmp_path / "mine", "mine", [{"context": "a", "choices": [" b", " c"], "answer": 0}])
    (mine / "my_group.yaml").write_text("group: my_group\ntask:\n  - mine\n")
    managers = {}
    with task_folder() as own:
        manager = check_tasks(["zoo_cloze", "mine"], [str(mine)], own, managers)
        assert asked == [False] and {"zoo_cloze", "zoo_passkey", "mine"} <= set(manager.all_subtasks)
        assert check_tasks(["zoo_passkey"], [str(mine)], own, managers) is manager and asked == [False]  # kept
        whole = check_tasks(["my_group"], [str(mine)], own, managers)
        assert asked == [False, True] and whole is not manager and "my_group" in whole.all_groups
        assert check_tasks(["mine", "my_group"], [str(mine)], own, managers) is whole and asked == [False, True]
        with pytest.raises(ValueError, match=r"unknown task\(s\): 'no_such_task'"):  # named against the whole index
            check_tasks(["mine", "no_such_task"], [str(mine)], own, managers)
        assert asked == [False, True]


def test_a_task_whose_answer_is_the_models_own_choice_scores_one_and_its_mirror_zero(tmp_path):
    model = tiny()
    lm = ZooLM(model, BYTES)
    items = []
    for i, context in enumerate(["The sky is", "Water is", "Two and two make", "The capital of France is", "Cats are"]):
        choices = [" blue", " wet", " four", " Paris", f" item {i}"]
        scores = [s for s, _ in lm.loglikelihood([request("loglikelihood", context, c) for c in choices])]
        best, worst = max(range(5), key=scores.__getitem__), min(range(5), key=scores.__getitem__)
        items.append({"context": context, "choices": choices, "answer": best, "worst": worst})
    assert run_task(model, tmp_path, "own_choice", [{**i, "answer": i["answer"]} for i in items]) == 1.0
    assert run_task(model, tmp_path, "mirror", [{**i, "answer": i["worst"]} for i in items]) == 0.0


def test_the_shipped_local_tasks_are_what_the_generator_makes():
    from recipes.evaluation.tasks import DATA, generate

    for name, items in generate().items():
        shipped = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]
        assert shipped == items
        assert all(0 <= item["answer"] < len(item["choices"]) == 4 for item in items)


def test_the_zoo_task_folder_points_at_the_shipped_data_and_is_removed_after_its_block(tmp_path, monkeypatch):
    from recipes.evaluation.tasks import DATA, TASKS, task_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with task_folder() as folder:
        assert sorted(p.name for p in folder.iterdir()) == sorted(f"{name}.yaml" for name in TASKS)
        for name in TASKS:
            assert json.dumps(str((DATA / f"{name}.jsonl").resolve())) in (folder / f"{name}.yaml").read_text()
    assert not folder.exists()
    with pytest.raises(KeyError), task_folder() as folder:
        raise KeyError("an evaluation that fails")
    assert not folder.exists() and not list(tmp_path.iterdir())


def test_the_length_suite_is_the_full_forward_loss_by_hand():
    model = tiny(max_seq_len=32)
    tokens = TextCorpus(seq_len=8).validation_tokens()[:600]
    result = length_suite(model, tokens, trained=16, multiples=(1, 2, 4), windows=3)
    rows = {(r["mode"], r["length"]): r for r in result["rows"]}
    assert set(rows) == {("plain", 16), ("plain", 32), ("ntk", 32), ("plain", 64), ("ntk", 64)}
    length, longest = 32, 64
    starts = [0, (len(tokens) - longest - 1) // 2, len(tokens) - longest - 1]  # the same windows at every length
    with torch.no_grad():
        by_hand = torch.stack([F.cross_entropy(model(tokens[s:s + length][None])[0], tokens[s + 1:s + length + 1],
                                               reduction="none") for s in starts]).mean(0)  # [32]
    assert rows[("plain", 32)]["loss"] == pytest.approx(float(by_hand.mean()), rel=1e-5)
    assert rows[("plain", 32)]["buckets"] == pytest.approx([float(by_hand[:16].mean()), float(by_hand[16:].mean())], rel=1e-5)
    assert rows[("ntk", 32)]["loss"] != rows[("plain", 64)]["loss"]
    with pytest.raises(ValueError, match="length 64 exceeds the model's max_seq_len=32; pass --extrapolate"):
        length_suite(model, tokens, trained=16, multiples=(4,), extrapolate=False)
    assert model.max_seq_len == 32 and not model.extrapolate and model.rotary.max_position == 32  # restored


def test_the_sink_suite_is_each_layers_weight_on_the_first_token_by_hand():
    """Per attention layer, the heads' mean weight on the first token of each window (queries 1…L−1), by hand from
    ``attention_weights`` on each layer's normed input; heads that cannot tell keys apart (no query map) give exactly
    the even spread; a model without attention is refused by name."""
    from recipes.evaluation.suites import sink_suite, uniform_first_share

    model = tiny(pattern="AM SM AM", max_seq_len=64)
    tokens = TextCorpus(seq_len=8).validation_tokens()[:300]
    result = sink_suite(model, tokens, trained=16, multiples=(1, 2), windows=3)
    rows = {(r["layer"], r["length"]): r["share"] for r in result["rows"]}
    assert set(rows) == {(layer, n) for layer in ("layer 0", "layer 2", "mean over layers") for n in (16, 32)}
    starts = [0, (len(tokens) - 32) // 2, len(tokens) - 32]
    inputs = []
    hook = model.blocks[2].sequence_mixer.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    with torch.no_grad():
        for s in starts:
            model(tokens[s:s + 32][None])
    hook.remove()
    with torch.no_grad():
        by_hand = torch.stack([model.blocks[2].sequence_mixer.attention_weights(x)[0, :, 1:, 0].mean(1)
                               for x in inputs]).mean(0)  # [H]: each head's share, over the windows
    assert rows[("layer 2", 32)] == pytest.approx(float(by_hand.mean()), rel=1e-5)
    busiest = {(r["layer"], r["length"]): r["busiest_head"] for r in result["rows"]}
    assert busiest[("layer 2", 32)] == pytest.approx(float(by_hand.max()), rel=1e-5)
    assert busiest[("layer 2", 32)] > rows[("layer 2", 32)]
    assert busiest[("mean over layers", 32)] == max(busiest[("layer 0", 32)], busiest[("layer 2", 32)])
    assert rows[("mean over layers", 32)] == pytest.approx((rows[("layer 0", 32)] + rows[("layer 2", 32)]) / 2)
    assert result["uniform"]["32"] == pytest.approx(sum(1 / (i + 1) for i in range(1, 32)) / 31)
    with torch.no_grad():
        for block in (0, 2):
            model.blocks[block].sequence_mixer.q_proj.weight.zero_()  # every score 0: an even spread over the keys
    even = sink_suite(model, tokens, trained=16, multiples=(1,), windows=2)
    assert [r["share"] for r in even["rows"]] == pytest.approx([uniform_first_share(16)] * 3)
    assert "| layer 0 | 16 |" in table(even) and "eval/sink/mean_over_layers/16" in scalars(even)
    with pytest.raises(ValueError, match=r"--suite sink measures attention layers \(QCAttention\); this model has none"):
        sink_suite(tiny(pattern="SM"), tokens, trained=16)


def test_the_entropy_suite_is_each_layers_attention_entropy_over_the_log_of_its_keys_by_hand():
    """Per attention layer, the heads' attention entropy of queries 1…L−1, each over ``log`` of the keys it sees, by
    hand from ``attention_weights``; exactly 1 for heads that spread evenly (no query map), 0 for a query on one key;
    the sink suite carries it beside the first token's share, and a family compares it by layer."""
    from recipes.evaluation.family import points
    from recipes.evaluation.suites import entropy_suite, normalised_entropy, sink_suite

    one_key = torch.eye(4)[None, None].expand(1, 2, 4, 4)  # [B, H, L, L]: each query on itself alone
    assert normalised_entropy(one_key).tolist() == [0.0, 0.0]
    even = torch.tril(torch.ones(4, 4)) / torch.arange(1, 5)[:, None]  # each query over its keys evenly
    assert normalised_entropy(even[None, None]).tolist() == pytest.approx([1.0])
    model = tiny(pattern="AM SM AM", max_seq_len=64)
    tokens = TextCorpus(seq_len=8).validation_tokens()[:300]
    result = entropy_suite(model, tokens, trained=16, multiples=(2,), windows=2)
    rows = {r["layer"]: r["entropy"] for r in result["rows"]}
    inputs = []
    hook = model.blocks[0].sequence_mixer.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    with torch.no_grad():
        for s in (0, len(tokens) - 32):
            model(tokens[s:s + 32][None])
    hook.remove()
    with torch.no_grad():
        weights = [model.blocks[0].sequence_mixer.attention_weights(x) for x in inputs]  # each [1, H, 32, 32]
    by_hand = []
    for w in weights:
        for i in range(1, 32):  # query i sees keys 0…i
            row = w[0, :, i, :i + 1]  # [H, i + 1]
            by_hand.append(-(row * row.log()).sum(-1) / math.log(i + 1))  # [H]
    assert rows["layer 0"] == pytest.approx(float(torch.stack(by_hand).mean()), rel=1e-5)
    assert 0 < rows["layer 0"] < 1
    assert rows["mean over layers"] == pytest.approx((rows["layer 0"] + rows["layer 2"]) / 2)
    assert result["suite"] == "entropy" and points(result)[("layer 2", 32)] == rows["layer 2"]
    assert "eval/entropy/layer_0/32" in scalars(result) and "entropy ÷ log(keys)" in table(result)
    with torch.no_grad():
        for block in (0, 2):
            model.blocks[block].sequence_mixer.q_proj.weight.zero_()
    even_rows = sink_suite(model, tokens, trained=16, multiples=(1,), windows=2)["rows"]
    assert [r["entropy"] for r in even_rows] == pytest.approx([1.0] * 3)
    windowed = tiny(pattern="AM", max_seq_len=64)
    windowed.blocks[0].sequence_mixer.sliding_window = 5  # (each query sees at most 5 keys: an even spread over them)
    with torch.no_grad():
        windowed.blocks[0].sequence_mixer.q_proj.weight.zero_()
    assert sink_suite(windowed, tokens, trained=16, multiples=(1,), windows=2)["rows"][0]["entropy"] == pytest.approx(1.0)


def test_a_model_that_cannot_see_the_key_scores_chance_on_passkey():
    blind = tiny(pattern="-M -M", max_seq_len=512)  # no sequence mixer: each position sees only itself
    result = passkey_suite(blind, BYTES.encode, trained=64, multiples=(1, 2), depths=(0.0, 0.5, 1.0), trials=24)
    accuracy = sum(c["accuracy"] * c["trials"] for c in result["cells"]) / sum(c["trials"] for c in result["cells"])
    assert result["chance"] == 0.25 and 0.12 <= accuracy <= 0.40  # 144 trials: chance ± 3 standard deviations


def test_the_eval_command_writes_the_harness_json_and_tensorboard_scalars(tmp_path, monkeypatch, capfd):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from recipes.cli import main as fit
    from recipes.evaluation.cli import main

    monkeypatch.chdir(tmp_path)
    fit(["fit", "--config", "quickstart.yaml", "--model.d_model", "16", "--model.pattern", "AM",
         "--model.mixers.A.init_args.n_heads", "2", "--data.init_args.seq_len", "32", "--trainer.max_steps", "2",
         "--trainer.limit_val_batches", "2", "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "false"])
    (tmp_path / "temp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))  # where the zoo's task YAMLs are written
    out = main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--tasks", "zoo_cloze,zoo_passkey", "--limit", "6",
                "--suite", "length", "--multiples", "1", "2", "--windows", "2", "--out", "eval/result"])
    written = json.loads((tmp_path / "eval" / "result.json").read_text())
    assert set(written["harness"]["results"]) == {"zoo_cloze", "zoo_passkey"}
    assert written["harness"]["configs"]["zoo_cloze"]["output_type"] == "multiple_choice"
    for task in ("zoo_cloze", "zoo_passkey"):  # each accuracy's closed-form standard error (bootstrap_iters=0: none)
        scores = written["harness"]["results"][task]
        assert scores["acc_stderr,none"] == pytest.approx((scores["acc,none"] * (1 - scores["acc,none"]) / 5) ** 0.5)
    assert written["suite"]["trained"] == 32  # the run's own length (from its config.yaml), not the recipe file's 128
    assert out["suite"]["rows"][0]["length"] == 32
    run = next((tmp_path / "runs" / "quickstart").iterdir())
    events = EventAccumulator(str(run))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"eval/zoo_cloze/acc", "eval/zoo_passkey/acc", "eval/length/plain/32", "eval/length/plain/64"} <= tags
    printed = capfd.readouterr()  # (capfd: what subprocesses write too)
    assert "zoo_cloze" in printed.out
    assert "not a git repository" not in printed.err  # lm-eval's `git describe` of a folder the zoo does not record
    assert not list((tmp_path / "temp").glob("zoo-tasks-*"))  # each evaluation left one behind in /tmp

    again = ["--config", "quickstart.yaml", "--ckpt_path", "last", "--suite", "length", "--multiples", "1", "--windows",
             "1", "--out", "eval/result.json"]  # the same files, named by the JSON's own name
    with pytest.raises(SystemExit, match=r"eval/result.json, eval/result.md and eval/result.png already exist: choose "
                                         r"another --out, or --force to replace them \(an earlier evaluation's"):
        main(again)
    assert "harness" in json.loads((tmp_path / "eval" / "result.json").read_text())  # refused before it ran
    main([*again, "--force"])
    assert "harness" not in json.loads((tmp_path / "eval" / "result.json").read_text())


def test_the_length_suite_reads_a_file_of_your_own_with_the_runs_tokenizer(tmp_path, monkeypatch, capsys):
    """``--text FILE``: the windows come from that file, tokenized as the run's text, not from the validation split;
    the loss equals the suite's on those tokens, and the result names the file."""
    from recipes.cli import main as fit
    from recipes.evaluation.cli import main
    from recipes.runs import load_run

    monkeypatch.chdir(tmp_path)
    fit(["fit", "--config", "quickstart.yaml", "--model.d_model", "16", "--model.pattern", "AM",
         "--model.mixers.A.init_args.n_heads", "2", "--data.init_args.seq_len", "32", "--trainer.max_steps", "2",
         "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false"])
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog, {i * i} times.\n" for i in range(40))
    (tmp_path / "mine.md").write_text(text, encoding="utf-8")
    common = ["--config", "quickstart.yaml", "--ckpt_path", "last", "--suite", "length", "--multiples", "1", "2"]
    out = main([*common, "--windows", "3", "--text", "mine.md"])
    model = load_run("quickstart.yaml").lm.model
    expected = length_suite(model, torch.tensor(TextCorpus.encode(text)), 32, multiples=(1, 2), windows=3,
                            extrapolate=False)  # (as the command without --extrapolate)
    assert out["suite"]["text"] == "mine.md" and out["suite"]["rows"] == expected["rows"]
    from recipes.evaluation.cli import parser, score_settings  # what a sweep's stored result is matched on: the
    # file's content, not its name alone

    assert re.fullmatch(r"mine\.md \(sha256 [0-9a-f]{16}\)", out["settings"]["text"])
    (tmp_path / "mine.md").write_text(text + "one more line\n", encoding="utf-8")
    assert score_settings(parser().parse_args([*common, "--text", "mine.md"]))["text"] != out["settings"]["text"]
    validation = main([*common, "--windows", "3"])["suite"]  # (the same command without it: the validation split)
    assert "text" not in validation and validation["rows"][0]["loss"] != expected["rows"][0]["loss"]
    (tmp_path / "short.txt").write_text("forty bytes of text, which is too short", encoding="utf-8")
    with pytest.raises(SystemExit, match="error: short.txt has 39 tokens; length 64 needs 65"):
        main([*common, "--text", "short.txt"])
    capsys.readouterr()
    for argv, said in [(["--text", "nowhere.txt"], "argument --text: no such file: nowhere.txt"),
                       (["--text", "-"], "argument --text: a file is read here, not stdin")]:
        with pytest.raises(SystemExit):
            main([*common, *argv])
        assert said in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"would not use --text \(it goes with --suite length, sink or entropy\)"):
        main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--suite", "passkey", "--text", "mine.md"])


@pytest.mark.parametrize("out", ["ratio_0.5_seed0", "ratio_0.5_seed0.json", "ratio_0.5_seed0.md"])
def test_an_eval_out_keeps_its_name_and_takes_the_result_suffixes(out):
    """``ratio_0.5_seed0`` was cut to ``ratio_0.json`` (``with_suffix``): two recipes' results in one file."""
    from recipes.evaluation.suites import result_paths

    assert [p.name for p in result_paths(Path("e") / out)] == [f"ratio_0.5_seed0{s}" for s in (".json", ".md", ".png")]


def test_the_default_lengths_past_max_seq_len_are_left_out_with_a_note(capsys):
    # `eval --suite length` on the bundled ablate_moe.yaml (T 128, max_seq_len 512) stopped at its fourth default
    # length with "length 1024 exceeds the model's max_seq_len=512", having evaluated nothing.
    from functools import partial
    from types import SimpleNamespace

    from components import QCAttention
    from recipes.evaluation.cli import run_suite

    torch.manual_seed(0)
    model = HybridLM(256, 16, "AM", {"A": partial(QCAttention, n_heads=2)}, max_seq_len=512)
    data = SimpleNamespace(validation_tokens=lambda: torch.randint(0, 256, (2100,)), seq_len=128,
                           encode=TextCorpus.encode, decode=TextCorpus.decode)
    recipe = {"data": {"init_args": {"seq_len": 128}}}
    args = SimpleNamespace(suite="length", multiples=None, extrapolate=False, windows=2, trials=1, text=None)
    result = run_suite(model, data, recipe, args)
    assert [row["length"] for row in result["rows"]] == [128, 256, 512]
    assert ("note: lengths 1024, 2048 left out, past the model's max_seq_len=512; --extrapolate evaluates past it"
            in capsys.readouterr().err)
    passkey = run_suite(model, data, recipe, SimpleNamespace(**{**vars(args), "suite": "passkey"}))
    assert sorted({cell["length"] for cell in passkey["cells"]}) == [64, 128, 256]  # 512 and its key: past 512
    assert "note: length 512 left out, past the model's max_seq_len=512 with the answer (a key of 6 tokens)" \
        in capsys.readouterr().err
    everything = run_suite(model, data, recipe, SimpleNamespace(**{**vars(args), "extrapolate": True}))
    assert sorted({row["length"] for row in everything["rows"]}) == [128, 256, 512, 1024, 2048]
    with pytest.raises(ValueError, match="length 1024 exceeds the model's max_seq_len=512"):  # asked for: refused
        run_suite(model, data, recipe, SimpleNamespace(**{**vars(args), "multiples": [8]}))


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "no_such_task"], "unknown task(s): 'no_such_task'"),
    (["--suite", "length", "--multiples", "64"], "exceeds the model's max_seq_len=512; pass --extrapolate"),
    ([], "name --tasks and/or a --suite"),
    (["--suite", "length", "--windows", "0"], "length suite: windows=0 must be an integer >= 1"),  # a torch error
    (["--suite", "passkey", "--trials", "0"], "passkey suite: trials=0 must be an integer >= 1"),  # ZeroDivisionError
    (["--suite", "length", "--multiples", "0"], "multiple 0.0 of the training length must be a number > 0"),  # NaN
    (["--suite", "length", "--multiples", "1.5"], "multiple 1.5 of the training length must be a whole number"),  # 1
    (["--suite", "passkey", "--multiples", "1", "-1"], "multiple -1.0 of the training length must be a number > 0"),
], ids=["unknown-task", "too-long", "nothing-to-do", "no-windows", "no-trials", "zero-length", "half-bucket",
        "negative-length"])
def test_eval_errors_are_named(tmp_path, monkeypatch, extra, message, trained_quickstart):
    from recipes.evaluation.cli import main

    monkeypatch.chdir(trained_quickstart)
    with pytest.raises(SystemExit) as info:
        main(["--config", "quickstart.yaml", "--ckpt_path", "last", *extra])
    assert message in str(info.value.code)


def test_each_suite_shows_a_bar_over_its_forward_passes_where_stderr_is_a_terminal(monkeypatch):
    """A suite over a large model ran for minutes without a word: each now drives one bar (tqdm, hidden off a
    terminal) whose total is the forward passes it makes, every one counted."""
    from recipes.evaluation import suites

    bars = []

    class Bar:
        def __init__(self, *, total, desc, disable, **kwargs):
            self.total, self.desc, self.disable, self.n = total, desc, disable, 0
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n=1):
            self.n += n

    monkeypatch.setattr(suites, "tqdm", Bar)
    model = tiny(max_seq_len=32)
    suites.length_suite(model, TextCorpus(seq_len=8).validation_tokens()[:600], trained=16, multiples=(1, 2),
                        windows=3)  # 1x plain, 2x plain and ntk: 3 cells of 3 windows
    suites.passkey_suite(tiny(max_seq_len=256), BYTES.encode, trained=64, multiples=(1, 2), depths=(0.5,), trials=2)
    task = {"vocab_size": 64, "seq_len": 16, "num_pairs": 2, "power_a": 0.01}
    suites.mqar_suite(model, task, multiples=(1, 2), examples=3, extrapolate=False)
    assert [(b.desc, b.total, b.n) for b in bars] == [("length suite", 9, 9), ("passkey suite", 4, 4),
                                                       ("mqar suite", 6, 6)]
    assert all(b.disable is None for b in bars)  # (tqdm's: off where stderr is no terminal)


def test_the_mqar_suite_takes_whole_multiples_and_a_positive_number_of_examples():
    from recipes.evaluation.suites import mqar_suite

    task = {"seq_len": 16, "num_pairs": 2, "vocab_size": 64}
    with pytest.raises(ValueError, match="mqar suite: multiple 1.5 of the training length must be a whole number"):
        mqar_suite(None, task, multiples=(1, 1.5))  # refused before the model is touched
    with pytest.raises(ValueError, match="mqar suite: examples=0 must be an integer >= 1"):
        mqar_suite(None, task, examples=0)


def test_the_mqar_suite_is_the_models_argmax_at_the_query_positions_by_hand():
    from recipes.data.mqar import MQARSplit
    from recipes.evaluation.suites import mqar_suite

    model = tiny(max_seq_len=32)
    task = {"vocab_size": 64, "seq_len": 16, "num_pairs": 2, "power_a": 0.01}
    result = mqar_suite(model, task, multiples=(1, 2), examples=3, extrapolate=False)
    assert (result["trained"], result["num_pairs"], result["chance"]) == (16, 2, 2 / 64)
    for row, multiple in zip(result["rows"], (1, 2), strict=True):
        split = MQARSplit("test", 3, 0, **{**task, "seq_len": 16 * multiple})
        correct = total = 0
        for i in range(3):
            item = split[i]
            with torch.no_grad():
                predicted = model(item["input_ids"][None])[0].argmax(-1)  # [T]
            queries = item["labels"] >= 0  # (the others are the ignore index)
            correct += int((predicted[queries] == item["labels"][queries]).sum())
            total += int(queries.sum())
        assert row == {"length": 16 * multiple, "multiple": multiple, "accuracy": correct / total, "queries": total}
        assert 3 <= total < 3 * 16 * multiple
    assert table(result).splitlines()[2:] == [f"| {r['length']} | {r['accuracy']:.4f} | {r['queries']} |"
                                              for r in result["rows"]]
    assert scalars(result) == {f"eval/mqar/{r['length']}": r["accuracy"] for r in result["rows"]}
    perfect = mqar_suite(RecallOracle(64), task, multiples=(1, 2), examples=3, extrapolate=False)
    assert [(r["accuracy"], r["queries"]) for r in perfect["rows"]] == [(1.0, 6), (1.0, 6)]  # 3 examples × 2 pairs


class RecallOracle(torch.nn.Module):
    """An MQAR model that recalls perfectly: at each later occurrence of a key (a token below ``vocab / 2``) it
    predicts the token that followed the key's first occurrence."""

    def __init__(self, vocab: int):
        super().__init__()
        self.embedding, self.vocab, self.max_seq_len = torch.nn.Embedding(1, 1), vocab, 1024

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [1, T] -> [1, T, vocab]
        logits, seen = torch.zeros(*ids.shape, self.vocab), {}
        for t, token in enumerate(ids[0].tolist()):
            if token < self.vocab // 2 and token in seen:
                logits[0, t, seen[token]] = 1.0
            elif token < self.vocab // 2 and t + 1 < ids.shape[1]:
                seen[token] = int(ids[0, t + 1])
        return logits


def test_the_suites_settings_and_short_splits_are_refused_by_name():
    from recipes.evaluation.suites import check_settings, position_mode

    model = tiny(max_seq_len=32)
    with pytest.raises(ValueError, match=r"position mode 'yarn' is not one of \('plain', 'ntk'\)"):
        with position_mode(model, "yarn", 16):
            pass
    with pytest.raises(ValueError, match="passkey suite: trials=True must be an integer >= 1"):
        check_settings("passkey", (1,), whole=False, trials=True)
    with pytest.raises(ValueError, match="length suite: no multiples of the training length given"):
        check_settings("length", (), whole=True, windows=2)
    with pytest.raises(ValueError, match=r"must be a whole number \(the losses are read in buckets"):
        check_settings("length", (1.5,), whole=True)
    assert check_settings("passkey", (0.5, 2), whole=False, trials=1) == (0.5, 2)
    tokens = torch.arange(65) % 256
    with pytest.raises(ValueError, match="the validation split has 64 tokens; length 64 needs 65"):
        length_suite(model, tokens[:64], trained=16, multiples=(4,), windows=1)
    assert length_suite(model, tokens, trained=16, multiples=(4,), windows=1)["rows"][0]["length"] == 64


def test_a_passkey_prompt_is_the_length_asked_with_the_key_at_its_depth():
    from recipes.evaluation.suites import QUESTION, passkey_prompt

    encode = BYTES.encode
    for length, depth in [(300, 0.0), (300, 0.5), (1000, 1.0), (1000, 0.25)]:
        context, answer = passkey_prompt(encode, 12345, length, depth)
        assert len(context) == length and answer == encode(" 12345")
        text = bytes(context).decode()
        assert text.endswith(QUESTION) and text.count("12345") == 2
        needle = text.index(" The pass key is 12345.")
        filler = length - len(encode(QUESTION)) - len(encode(" The pass key is 12345. Remember it. 12345 is the pass key."))
        assert needle == round(depth * filler)
    context, _ = passkey_prompt(encode, 12345, 10, 0.5)  # shorter than the key and question: no filler at all
    assert bytes(context).decode().startswith(" The pass key is 12345.")


def test_the_passkey_suite_draws_distinct_keys_and_reports_its_cells(monkeypatch):
    from recipes.evaluation import suites

    seen, model = [], tiny(max_seq_len=64)

    def score_first_best(model, context, candidates):  # the true key (listed first) always scores highest
        seen.append(candidates)
        return [(0.0, True)] + [(-1.0, False)] * (len(candidates) - 1)

    monkeypatch.setattr(suites, "score_continuations", score_first_best)
    result = suites.passkey_suite(model, BYTES.encode, trained=64, multiples=(1, 4), depths=(0.0, 1.0), trials=40,
                                  choices=4)  # 4 × 64 past max_seq_len: extrapolation is the default
    assert all(len({tuple(c) for c in candidates}) == 4 for candidates in seen)  # four different keys every time
    assert [(c["length"], c["depth"], c["accuracy"]) for c in result["cells"]] == [
        (64, 0.0, 1.0), (64, 1.0, 1.0), (256, 0.0, 1.0), (256, 1.0, 1.0)]
    assert table(result).splitlines() == ["| length | depth 0 | depth 1 |", "|---|---|---|", "| 64 | 1.00 | 1.00 |",
                                          "| 256 | 1.00 | 1.00 |", "", "chance: 0.25"]
    assert scalars(result) == {"eval/passkey/64/depth_0": 1.0, "eval/passkey/64/depth_1": 1.0,
                               "eval/passkey/256/depth_0": 1.0, "eval/passkey/256/depth_1": 1.0}


def test_each_suites_table_and_figure_are_written_where_out_says(tmp_path):
    from recipes.evaluation.suites import passkey_grid, write_result

    length = {"suite": "length", "trained": 16, "bucket": 16, "rows": [
        {"mode": "plain", "length": 16, "multiple": 1, "loss": 2.0, "buckets": [2.0], "windows": 1},
        {"mode": "ntk", "length": 32, "multiple": 2, "loss": 2.5, "buckets": [2.0, 3.0], "windows": 1}]}
    assert table(length).splitlines() == ["| mode | length | loss | pos 0–15 | pos 16–31 |", "|---|---|---|---|---|",
                                          "| plain | 16 | 2.0000 | 2.0000 |  |", "| ntk | 32 | 2.5000 | 2.0000 | 3.0000 |"]
    assert scalars(length) == {"eval/length/plain/16": 2.0, "eval/length/ntk/32": 2.5}
    passkey = {"suite": "passkey", "trained": 16, "chance": 0.25, "cells": [
        {"length": n, "depth": d, "accuracy": a, "trials": 2} for n, d, a in [(16, 0.0, 1.0), (16, 1.0, 0.5),
                                                                              (32, 0.0, 0.0), (32, 1.0, 0.5)]]}
    assert table(passkey).splitlines()[2:4] == ["| 16 | 1.00 | 0.50 |", "| 32 | 0.00 | 0.50 |"]
    lengths, depths, grid = passkey_grid({**passkey, "cells": passkey["cells"][::-1]})  # (the figure's cells)
    assert (lengths, depths, grid.tolist()) == ([16, 32], [0.0, 1.0], [[1.0, 0.5], [0.0, 0.5]])
    mqar = {"suite": "mqar", "trained": 16, "num_pairs": 2, "chance": 1 / 32,
            "rows": [{"length": 16, "multiple": 1, "accuracy": 0.5, "queries": 4}]}
    sink = {"suite": "sink", "trained": 16, "windows": 2, "uniform": {"16": 0.2},
            "rows": [{"layer": layer, "length": 16, "share": 0.1, "busiest_head": 0.3, "entropy": 0.5}
                     for layer in ("layer 0", "mean over layers")]}
    assert table(sink).splitlines()[2] == "| layer 0 | 16 | 0.1000 | 0.3000 | 0.2000 | 0.5000 |"
    assert scalars({**sink, "suite": "entropy"}) == {"eval/entropy/layer_0/16": 0.5, "eval/entropy/mean_over_layers/16": 0.5}
    for name, result in [("length", length), ("passkey", passkey), ("mqar", mqar), ("sink", sink),
                         ("entropy", {**sink, "suite": "entropy"})]:
        written = write_result(result, tmp_path / "new" / "folder" / name)
        assert written == [tmp_path / "new" / "folder" / f"{name}.md", tmp_path / "new" / "folder" / f"{name}.png"]
        assert written[0].read_text() == table(result) + "\n"
        assert written[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_only_a_tasks_numeric_metrics_become_scalars():
    from recipes.evaluation.cli import harness_scalars

    results = {"results": {"zoo_cloze": {"alias": "zoo_cloze", "acc,none": 0.5, "acc_stderr,none": 0.1, "n": 3,
                                         "flag": True, "name": "x"}, "zoo_passkey": {"acc,none": 1}}}
    assert harness_scalars(results) == {"eval/zoo_cloze/acc": 0.5, "eval/zoo_cloze/n": 3.0, "eval/zoo_passkey/acc": 1.0}
    assert harness_scalars({"results": None}) == harness_scalars({}) == {}


def test_samples_are_one_json_line_each_beside_the_result(tmp_path):
    from recipes.evaluation.cli import samples_path, write_samples

    assert samples_path(tmp_path / "eval" / "r.json") == tmp_path / "eval" / "r.samples.jsonl"
    out = tmp_path / "new" / "folder" / "r.samples.jsonl"
    count = write_samples({"zoo_cloze": [{"doc_id": 0}, {"doc_id": 1, "path": Path("x")}], "zoo_passkey": [{"doc_id": 0}]},
                          out)
    assert count == 3
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"task": "zoo_cloze", "doc_id": 0}, {"task": "zoo_cloze", "doc_id": 1, "path": "x"},
        {"task": "zoo_passkey", "doc_id": 0}]


def test_scalars_go_to_the_checkpoints_run_folder_and_nowhere_else(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from recipes.evaluation.cli import log_scalars

    run = tmp_path / "runs" / "quickstart" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    assert log_scalars(run / "checkpoints" / "last.ckpt", {"eval/length/plain/16": 2.5}, step=7) == run
    events = EventAccumulator(str(run))
    events.Reload()
    [event] = events.Scalars("eval/length/plain/16")
    assert (event.step, event.value) == (7, 2.5)
    assert log_scalars(run / "checkpoints" / "last.ckpt", {}, step=7) is None
    assert log_scalars(tmp_path / "loose.ckpt", {"eval/x": 1.0}, step=7) is None  # no run folder: nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_a_suite_the_recipes_data_cannot_feed_is_refused_by_name():
    from types import SimpleNamespace

    from recipes.data.mqar import MQAR
    from recipes.evaluation.cli import run_suite
    from recipes.runs import text_tokenizer

    model = tiny(max_seq_len=64)
    args = SimpleNamespace(suite="mqar", multiples=[1], extrapolate=False, windows=None, trials=None, text=None)
    with pytest.raises(ValueError, match="--suite mqar needs an MQAR recipe; this one's data module is TextCorpus"):
        run_suite(model, TextCorpus(seq_len=16), {}, args)
    mqar = MQAR(vocab_size=64, seq_len=16, num_pairs=2)
    assert run_suite(model, mqar, {}, SimpleNamespace(**{**vars(args), "multiples": [1, 2]}))["trained"] == 16
    for suite in ("length", "passkey"):
        with pytest.raises(ValueError, match="the recipe's data has no seq_len: the training length"):
            run_suite(model, SimpleNamespace(), {"data": {"init_args": {}}}, SimpleNamespace(**{**vars(args), "suite": suite}))
    recipe = {"data": {"init_args": {"seq_len": 16}}}
    for suite in ("length", "sink"):
        with pytest.raises(ValueError, match=rf"--suite {suite} needs a text corpus with a validation split \(or --text "
                                             "FILE\); this is MQAR"):
            run_suite(model, mqar, recipe, SimpleNamespace(**{**vars(args), "suite": suite}))
    with pytest.raises(ValueError, match="--suite passkey needs text, and the recipe's data module MQAR has no text"):
        run_suite(model, mqar, recipe, SimpleNamespace(**{**vars(args), "suite": "passkey"}))
    with pytest.raises(ValueError, match="has no text tokenizer"):
        text_tokenizer(SimpleNamespace(encode=BYTES.encode), "--tasks")  # an encode without a decode
    length = run_suite(model, TextCorpus(seq_len=16), {"data": {"init_args": {"seq_len": 8}}},
                       SimpleNamespace(**{**vars(args), "suite": "length", "multiples": [1]}))
    assert length["trained"] == 8  # the recipe's own length, over the data module's


def test_the_zoo_tasks_are_known_beside_an_include_path_and_a_missing_folder_is_named(tmp_path):
    pytest.importorskip("lm_eval")
    from recipes.evaluation.cli import check_tasks
    from recipes.evaluation.tasks import task_folder, write_task

    mine = write_task(tmp_path / "mine", "my_task", [{"context": "a", "choices": [" b", " c"], "answer": 0}])
    with task_folder() as own:
        manager = check_tasks(["zoo_cloze", "my_task"], [str(mine)], own)
        assert {"zoo_cloze", "zoo_passkey", "my_task"} <= set(manager.all_tasks)
        with pytest.raises(FileNotFoundError, match=f"--include_path {tmp_path / 'gone'}: no such folder"):
            check_tasks(["zoo_cloze"], [str(tmp_path / "gone")], own)


@pytest.mark.parametrize("extra, message", [
    (["--suite", "passkey", "--windows", "4"], "would not use --windows (it goes with --suite length, sink or entropy)"),
    (["--suite", "length", "--trials", "4"], "would not use --trials (it goes with --suite passkey)"),
    (["--tasks", "zoo_cloze", "--multiples", "1", "--extrapolate"],
     "would not use --multiples (it goes with a --suite), --extrapolate (it goes with a --suite)"),
    (["--suite", "length", "--limit", "5", "--num_fewshot", "0", "--batch_size", "4"],
     "would not use --num_fewshot (it goes with --tasks), --limit (it goes with --tasks), --batch_size (it goes with"),
    (["--suite", "mqar", "--include_path", "tasks", "--gen_kwargs", "max_gen_toks=3"],
     "would not use --include_path (it goes with --tasks), --gen_kwargs (it goes with --tasks)"),
])
def test_eval_refuses_an_option_nothing_it_runs_would_read(extra, message):
    """``--windows 16`` with the passkey suite (or ``--limit`` with a suite alone) was ignored: the numbers printed
    were measured otherwise than asked. Refused before the checkpoint is read."""
    from recipes.evaluation.cli import main

    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["--config", "quickstart.yaml", "--ckpt_path", "no-such.ckpt", *extra])


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "zoo_cloze", "--limit", "0"], "argument --limit: 0 must be a finite number > 0"),  # the harness: "did not find any docs!"
    (["--tasks", "zoo_cloze", "--num_fewshot", "-1"], "argument --num_fewshot: -1 must be >= 0"),  # ran as 0 before
    (["--tasks", "zoo_cloze", "--bootstrap_iters", "-1"], "argument --bootstrap_iters: -1 must be >= 0"),
    (["--tasks", "zoo_cloze", "--limit", "x"], "argument --limit: invalid float value: 'x'"),
    (["--tasks", "zoo_passkey", "--gen_kwargs", "max_gen_toks:5"], "argument --gen_kwargs: 'max_gen_toks:5' is not "
                                                                  "key=value[,key=value...]"),
    (["--tasks", "zoo_passkey", "--gen_kwargs", "max_gen_toks=5,do_sample"], "'max_gen_toks=5,do_sample' is not"),
    (["--tasks", "zoo_passkey", "--gen_kwargs", "=5"], "argument --gen_kwargs: '=5' is not key=value"),
])
def test_eval_refuses_impossible_harness_settings_when_parsing(extra, message, capsys):
    from recipes.evaluation.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--config", "quickstart.yaml", "--ckpt_path", "last", *extra])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_eval_takes_the_threads_given_and_says_so_on_stderr(tmp_path, monkeypatch, capsys):
    """``--threads N`` (else the cores other processes leave free, as for ``fit``), set before the model loads."""
    from recipes.evaluation.cli import main

    monkeypatch.chdir(tmp_path)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(SystemExit, match="no-such.ckpt"):
            main(["--config", "quickstart.yaml", "--ckpt_path", "no-such.ckpt", "--suite", "length", "--threads", "1"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    said = capsys.readouterr()
    assert said.err == "torch threads: 1 (--threads)\n" and said.out == ""


@pytest.mark.parametrize("given", [["--config", "quickstart.yaml"], ["--ckpt_path", "last"]])
def test_eval_needs_both_the_recipe_and_the_checkpoint(given, capsys):
    from recipes.evaluation.cli import main

    with pytest.raises(SystemExit) as info:
        main([*given, "--suite", "length"])
    missing = "--ckpt_path" if given[0] == "--config" else "--config"
    assert info.value.code == 2 and f"the following arguments are required: {missing}" in capsys.readouterr().err


def test_a_hub_task_offline_is_one_line_that_names_the_local_tasks(monkeypatch, trained_quickstart):
    import recipes.evaluation.cli as cli

    def offline(*args):  # what the datasets library raises for a hub task without a network
        raise ConnectionError("Couldn't reach 'Rowan/hellaswag' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.chdir(trained_quickstart)
    monkeypatch.setattr(cli, "run_harness", offline)
    with pytest.raises(SystemExit, match=r"error: Couldn't reach 'Rowan/hellaswag' .* downloads its dataset on first use"
                                         r".*zoo_cloze, zoo_passkey"):
        cli.main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--tasks", "hellaswag"])


def test_a_recipe_without_text_and_a_missing_harness_are_named(tmp_path, monkeypatch, trained_quickstart):
    from recipes.evaluation.cli import main

    monkeypatch.chdir(trained_quickstart)
    import recipes.evaluation

    monkeypatch.setitem(sys.modules, "recipes.evaluation.harness", None)  # as if lm-eval were not installed
    monkeypatch.delattr(recipes.evaluation, "harness", raising=False)
    with pytest.raises(SystemExit, match=r"--tasks needs EleutherAI's lm-evaluation-harness .*pip install -e \"\.\[eval\]\""):
        main(["--config", "quickstart.yaml", "--ckpt_path", "last", "--tasks", "zoo_cloze"])
    monkeypatch.undo()
    from recipes.runs import text_tokenizer
    from recipes.data import MQAR

    with pytest.raises(ValueError, match="the recipe's data module MQAR has no text tokenizer"):
        text_tokenizer(MQAR(seq_len=16, num_pairs=2, vocab_size=64), "--tasks")


def test_log_samples_writes_each_example_beside_the_json_and_gen_kwargs_reach_the_generation(trained_quickstart,
                                                                                            monkeypatch, capsys):
    """The per-example records lm-eval keeps (inputs, the model's answers, its scores) for reading what a model
    answered; lm-eval's own command writes them with --log_samples, which the zoo's command lacked."""
    from recipes.evaluation.cli import main

    monkeypatch.chdir(trained_quickstart)
    tasks = trained_quickstart / "gen_task"
    tasks.mkdir(exist_ok=True)
    (tasks / "sums.jsonl").write_text("".join(json.dumps({"question": f"{a} + {a} =", "answer": str(2 * a)}) + "\n"
                                              for a in (1, 2, 3)))
    (tasks / "sums.yaml").write_text(
        f"task: sums\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tasks / 'sums.jsonl'}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: question\ndoc_to_target: answer\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 20\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n")
    budgets = []  # (the answers: the task's own, so that exact_match scores them)
    monkeypatch.setattr("recipes.evaluation.harness.ZooLM.generate_texts",
                        lambda self, prompts, untils, max_new_tokens, *sampling:
                        budgets.append(max_new_tokens) or [str(2 * int(chr(p[0]))) for p in prompts])
    args = ["--config", "quickstart.yaml", "--ckpt_path", "last", "--tasks", "zoo_cloze,sums", "--limit", "3",
            "--include_path", str(tasks)]
    with pytest.raises(SystemExit, match="--log_samples writes the examples of --tasks beside --out FILE"):
        main([*args, "--log_samples"])
    out = main([*args, "--log_samples", "--gen_kwargs", "max_gen_toks=7", "--out", "eval/with"])
    assert set(budgets) == {7} and out["harness"]["results"]["sums"]["exact_match,none"] == 1.0
    lines = [json.loads(line) for line in (trained_quickstart / "eval" / "with.samples.jsonl").read_text().splitlines()]
    assert sorted(line["task"] for line in lines) == ["sums"] * 3 + ["zoo_cloze"] * 3
    assert all({"doc", "arguments", "resps", "target"} <= set(line) for line in lines)
    assert sorted(line["resps"][0][0] for line in lines if line["task"] == "sums") == ["2", "4", "6"]
    assert "samples" not in json.loads((trained_quickstart / "eval" / "with.json").read_text())["harness"]
    capsys.readouterr()
    main([*args, "--out", "eval/new/folder/without"])  # tasks alone: no suite's table made the folder first
    written = json.loads((trained_quickstart / "eval" / "new" / "folder" / "without.json").read_text())
    assert set(written["harness"]["results"]) == {"sums", "zoo_cloze"}
    assert re.search(r"TensorBoard: \d+ scalars under eval/ in .*quickstart.* \(step \d+\)", capsys.readouterr().out)
    (trained_quickstart / "eval" / "with.json").unlink()  # the samples alone are not overwritten either
    with pytest.raises(SystemExit, match="eval/with.samples.jsonl already exists: choose another --out, or --force"):
        main([*args, "--log_samples", "--out", "eval/with"])


@pytest.fixture(scope="module")
def trained_quickstart(tmp_path_factory):
    from recipes.cli import main as fit

    folder = tmp_path_factory.mktemp("quick")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        fit(["fit", "--config", "quickstart.yaml", "--model.d_model", "16", "--model.pattern", "AM",
             "--model.mixers.A.init_args.n_heads", "2", "--data.init_args.seq_len", "32", "--trainer.max_steps", "1",
             "--trainer.limit_val_batches", "2", "--trainer.val_check_interval", "1", "--trainer.enable_progress_bar", "false"])
    return folder


def test_a_familys_suite_results_tabulate_per_mode_and_length_against_the_baseline(tmp_path, monkeypatch):
    """The suites' results as a family's table (no model: the results are given): the length suite's loss per mode
    and length, passkey's accuracy averaged over depths, MQAR's per length; a recipe compared with the baseline
    where both have the cell, none where either lacks it, and a report without a finished run says so."""
    from scipy import stats as scipy_stats

    import recipes.evaluation.family as family_module
    from recipes.evaluation.family import plot, points, report, table
    from recipes.sweep.records import Run

    def length(losses):
        return {"suite": "length", "rows": [{"mode": m, "length": n, "loss": v} for (m, n), v in losses.items()]}

    results = {("a", 0): length({("plain", 64): 2.0, ("ntk", 64): 2.5}), ("a", 1): length({("plain", 64): 2.2,
                                                                                            ("ntk", 64): 2.7}),
               ("b", 0): length({("plain", 64): 3.0, ("plain", 128): 4.0}), ("b", 1): length({("plain", 64): 3.4})}
    rows = table(results, "a").splitlines()
    assert rows[0].startswith("| recipe | mode | length | runs | loss, mean ± std | Δ vs a | p (Welch) |")
    p = scipy_stats.ttest_ind([3.0, 3.4], [2.0, 2.2], equal_var=False).pvalue
    assert rows[2:] == ["| a | ntk | 64 | 2 | 2.6000 ± 0.1414 | (baseline) | - | - |",  # sorted by length, then mode
                        "| a | plain | 64 | 2 | 2.1000 ± 0.1414 | (baseline) | - | - |",
                        f"| b | plain | 64 | 2 | 3.2000 ± 0.2828 | +1.1000 | {p:.3g} | {p:.3g} |",
                        "| b | plain | 128 | 1 | 4.0000 ± 0.0000 | - | - | - |"]  # the baseline has no such cell
    assert "| b | plain | 64 | 2 | 3.2000 ± 0.2828 |\n" in table(results, None)  # no comparison columns: no baseline
    plot(results, tmp_path / "length.png", "length")
    assert (tmp_path / "length.png").stat().st_size > 0

    passkey = {"suite": "passkey", "cells": [{"length": 64, "depth": 0.1, "accuracy": 1.0},
                                             {"length": 64, "depth": 0.9, "accuracy": 0.5},
                                             {"length": 128, "depth": 0.5, "accuracy": 0.25}]}
    assert points(passkey) == {("all depths", 64): 0.75, ("all depths", 128): 0.25}
    assert points({"suite": "mqar", "rows": [{"length": 64, "accuracy": 0.3}]}) == {("-", 64): 0.3}
    assert table({("a", 0): passkey}, None).splitlines()[:2] == ["| recipe | mode | length | runs | accuracy, mean ± std |",
                                                                "|---|---|---|---|---|"]

    sink = {"suite": "sink", "rows": [{"layer": "layer 1", "length": 64, "share": 0.4},
                                      {"layer": "mean over layers", "length": 64, "share": 0.4}]}
    assert points(sink) == {("layer 1", 64): 0.4, ("mean over layers", 64): 0.4}
    drawn = kept_axes(monkeypatch, family_module)
    plot({("a", 0): {**sink, "uniform": {"64": 0.07}}, ("a", 1): {**sink, "uniform": {"64": 0.07}}},
         tmp_path / "sink.png", "sink")
    assert [t.get_text() for t in drawn[-1].get_xticklabels()] == ["layer 1", "mean over layers"]
    assert drawn[-1].get_ylabel() == "weight on the first token" and (tmp_path / "sink.png").stat().st_size > 0
    assert table({("a", 0): sink}, None).splitlines()[:3] == [
        "| recipe | layer | length | runs | first token's share, mean ± std |", "|---|---|---|---|---|",
        "| a | layer 1 | 64 | 1 | 0.4000 ± 0.0000 |"]
    entropy = {"suite": "entropy", "rows": [{**row, "entropy": 0.9} for row in sink["rows"]]}
    plot({("a", 0): entropy}, tmp_path / "entropy.png", "entropy")  # (by layer, as the sink's)
    assert [t.get_text() for t in drawn[-1].get_xticklabels()] == ["layer 1", "mean over layers"]
    assert drawn[-1].get_ylabel() == "attention entropy ÷ log(keys)"
    assert [list(line.get_ydata()) for line in drawn[-1].get_lines() if len(line.get_ydata()) == 2][0] == [0.9, 0.9]
    assert table({("a", 0): entropy}, None).splitlines()[2] == "| a | layer 1 | 64 | 1 | 0.9000 ± 0.0000 |"

    harness = {("a", 0): {"results": {"zoo_cloze": {"acc,none": 0.5, "acc_stderr,none": 0.1, "alias": "zoo_cloze"}}}}
    assert points(harness[("a", 0)]) == {("acc", "zoo_cloze"): 0.5}  # not the standard error, not the alias
    assert table(harness, None).splitlines()[2] == "| a | acc | zoo_cloze | 1 | 0.5000 ± 0.0000 |"
    plot(harness, tmp_path / "tasks.png", "tasks")  # one run a recipe: no spread to draw
    assert (tmp_path / "tasks.png").stat().st_size > 0

    failed = [Run(tmp_path / "a.yaml", tmp_path / "nowhere", returncode=1, log=None, seed=0)]
    assert report(failed, tmp_path / "logs", "family", "length", None, []) == \
        f"no finished run to evaluate in {tmp_path / 'logs'}"


def kept_axes(monkeypatch, module) -> list:
    """``module.png_figure`` made to keep each figure's axes, to be read: the list they are appended to."""
    from contextlib import contextmanager

    drawn, real = [], module.png_figure

    @contextmanager
    def keeping(path, **kwargs):  # the real figure (drawn and saved), its axes kept
        with real(path, **kwargs) as (figure, axes):
            drawn.append(axes)
            yield figure, axes

    monkeypatch.setattr(module, "png_figure", keeping)
    return drawn


def test_a_familys_figure_draws_each_recipe_and_mode_over_the_lengths(monkeypatch, tmp_path):
    """The length suite's figure: a line per recipe and mode through the means over seeds (the NTK ones dashed), the
    loss on the y axis; a passkey suite's is of accuracy."""
    import recipes.evaluation.family as family

    drawn = kept_axes(monkeypatch, family)

    def length(plain, ntk):
        return {"suite": "length", "rows": [{"mode": mode, "length": n, "loss": loss} for mode, losses in
                                            (("plain", plain), ("ntk", ntk)) for n, loss in zip((64, 128), losses)]}

    family.plot({("a", 0): length((2.0, 3.0), (2.5, 2.6)), ("a", 1): length((2.2, 3.4), (2.5, 2.8))},
                tmp_path / "length.png", "length")
    handles, labels = drawn[-1].get_legend_handles_labels()
    lines = {label: handle.lines[0] for handle, label in zip(handles, labels)}
    assert {label: line.get_linestyle() for label, line in lines.items()} == {"a (ntk)": "--", "a (plain)": "-"}
    assert list(lines["a (plain)"].get_ydata()) == pytest.approx([2.1, 3.2])
    assert list(lines["a (ntk)"].get_xdata()) == [64, 128] and drawn[-1].get_ylabel() == "validation loss"
    passkey = {"suite": "passkey", "cells": [{"length": 64, "depth": 0.5, "accuracy": 1.0}]}
    family.plot({("a", 0): passkey}, tmp_path / "passkey.png", "passkey")
    assert drawn[-1].get_ylabel() == "accuracy" and (tmp_path / "passkey.png").stat().st_size > 0


def test_the_settings_a_stored_result_is_matched_on_hold_a_task_folders_content(tmp_path, monkeypatch):
    """A task made again with other questions under the same name and folder is another task: the folder's files are
    hashed into the settings, so a sweep scores its runs again."""
    from recipes.evaluation.cli import parser, score_settings

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "mine.jsonl").write_text('{"context": "a", "choices": [" b", " c"], "answer": 0}\n')
    argv = ["--config", "quickstart.yaml", "--ckpt_path", "last", "--tasks", "mine", "--include_path",
            str(tmp_path / "tasks"), "--limit", "8"]
    first = score_settings(parser().parse_args(argv))
    assert first == score_settings(parser().parse_args(argv))  # the same files: the same settings
    assert first["limit"] == 8 and first["tasks"] == "mine" and first["suite"] is None
    assert re.fullmatch(rf"{re.escape(str(tmp_path / 'tasks'))} \(sha256 [0-9a-f]{{16}}\)", first["include_path"][0])
    (tmp_path / "tasks" / "mine.jsonl").write_text('{"context": "a", "choices": [" b", " c"], "answer": 1}\n')
    assert score_settings(parser().parse_args(argv))["include_path"] != first["include_path"]
    assert "batch_size" not in first and "device" not in first  # (they change no score)

    # questions outside the folder, named by its YAMLs (data_files matched as datasets matches them, relative to the
    # working folder, as lm-eval reads them; a local dataset_path): changed, they too make another task
    (tmp_path / "elsewhere" / "more").mkdir(parents=True)
    (tmp_path / "elsewhere" / "more" / "q.jsonl").write_text('{"context": "x", "choices": [" y"], "answer": 0}\n')
    (tmp_path / "local.jsonl").write_text('{"context": "x", "choices": [" y"], "answer": 0}\n')
    (tmp_path / "tasks" / "outside.yaml").write_text(
        "task: outside\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: [elsewhere/**/*.jsonl]\n"
        "process_docs: !function utils.process\ntest_split: test\n")
    (tmp_path / "tasks" / "path.yaml").write_text(f"task: path\ndataset_path: {tmp_path / 'local.jsonl'}\n")
    (tmp_path / "tasks" / "broken.yaml").write_text("task: [unclosed\n")  # (lm-eval names it; not the settings)
    monkeypatch.chdir(tmp_path)
    from recipes.evaluation.cli import task_files

    assert task_files(tmp_path / "tasks")[-2:] == [tmp_path / "elsewhere" / "more" / "q.jsonl", tmp_path / "local.jsonl"]
    before = score_settings(parser().parse_args(argv))["include_path"]
    for edited in ("elsewhere/more/q.jsonl", "local.jsonl"):
        (tmp_path / edited).write_text('{"context": "x", "choices": [" z"], "answer": 0}\n')
        after = score_settings(parser().parse_args(argv))["include_path"]
        assert after != before, edited
        before = after


def test_a_sweeps_task_results_are_named_by_their_tasks():
    from recipes.evaluation.family import result_name, tasks_named

    assert tasks_named(["--limit", "8", "--tasks", "a,b"]) == tasks_named(["--tasks=a,b"]) == "a,b"
    assert result_name("tasks", ["--tasks", "zoo_cloze,arc"]) == "tasks_zoo_cloze_arc"
    assert result_name("length", []) == "length"
    for extra in ([], ["--tasks"], ["--limit", "8"]):  # (a --tasks with nothing after it names none)
        with pytest.raises(ValueError, match=r"name the tasks to evaluate: --tasks T1,T2"):
            tasks_named(extra)


def test_a_sweeps_runs_are_scored_on_a_task_with_statistics_over_seeds(tmp_path, trained_quickstart, capsys,
                                                                      monkeypatch):
    """``python -m recipes.sweep --from LOGS --tasks T``: every run's score lands in the family's table. Recipe
    b's weights are all zero, so every choice's log-likelihood is −(its bytes)·log 256 and the harness
    picks the shortest choice (the first among equals): its accuracy is known without the model. The harness's
    task index (of the zoo's own folder alone: zoo_cloze is one of its tasks) is built once for the sweep's
    evaluations."""
    import shutil

    import lm_eval.tasks

    indexed = []

    class CountedTaskManager(lm_eval.tasks.TaskManager):
        def __init__(self, *args, **kwargs):
            indexed.append((kwargs["include_path"], kwargs["include_defaults"]))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", CountedTaskManager)

    from recipes.checkpoints import load_checkpoint
    from recipes.recipe_files import resolve_config
    from recipes.sweep.cli import main as sweep
    from recipes.sweep.records import Run, write_manifest
    from recipes.evaluation.tasks import DATA
    from recipes.evaluation.cli import _SHARED as shared_index_entries

    run = next((trained_quickstart / "runs" / "quickstart").iterdir())
    family = tmp_path / "family"
    family.mkdir()
    runs = []
    for recipe in ("a", "b"):
        shutil.copy(resolve_config("quickstart.yaml"), family / f"{recipe}.yaml")
        for seed in (0, 1):
            folder = tmp_path / "runs" / f"{recipe}_seed{seed}"
            shutil.copytree(run, folder)
            if recipe == "b":
                path = folder / "checkpoints" / "last.ckpt"
                checkpoint = load_checkpoint(path)
                checkpoint["state_dict"] = {k: torch.zeros_like(v) for k, v in checkpoint["state_dict"].items()}
                torch.save(checkpoint, path)
            runs.append(Run(family / f"{recipe}.yaml", folder, returncode=0, log=None, seed=seed))
    runs.append(Run(family / "a.yaml", tmp_path / "runs" / "a_seed2", returncode=1, log=None, seed=2))  # failed: skipped
    logs = tmp_path / "logs"
    logs.mkdir()
    write_manifest(logs, "family", runs)
    sweep(["--from", str(logs), "--tasks", "zoo_cloze", "--suite-args", "--limit 8", "--baseline", "a"])

    assert len(indexed) == 1 and all(Path(p).name.startswith("zoo-tasks-") for p in indexed[0][0])  # four evaluations
    assert indexed[0][1] is False  # without the harness's own tasks
    scores = {(r, s): json.loads((logs / "tasks_zoo_cloze" / f"{r}_seed{s}.json").read_text())
              ["harness"]["results"]["zoo_cloze"]["acc,none"] for r in "ab" for s in (0, 1)}
    items = [json.loads(line) for line in (DATA / "zoo_cloze.jsonl").read_text().splitlines()[:8]]
    shortest = [min(range(4), key=lambda i: (len(item["choices"][i].encode()), i)) for item in items]
    assert scores["b", 0] == scores["b", 1] == sum(s == item["answer"] for s, item in zip(shortest, items)) / 8
    assert scores["a", 0] == scores["a", 1]  # the same checkpoint twice
    table = (logs / "tasks_zoo_cloze.md").read_text()
    row_b = next(line for line in table.splitlines() if line.startswith("| b | acc | zoo_cloze |"))
    assert table.startswith("# family: tasks zoo_cloze\n\n| recipe | metric | task |") and row_b in capsys.readouterr().out
    assert f"| 2 | {scores['b', 0]:.4f} ± 0.0000 | {scores['b', 0] - scores['a', 0]:+.4f} |" in row_b
    assert "sample_len" not in table  # lm-eval's bookkeeping is not a score
    assert (logs / "tasks_zoo_cloze.png").stat().st_size > 0

    path = tmp_path / "runs" / "a_seed0" / "checkpoints" / "last.ckpt"  # trained on since (to b's weights): scored again
    checkpoint = load_checkpoint(path)
    checkpoint["global_step"] += 1
    checkpoint["state_dict"] = {k: torch.zeros_like(v) for k, v in checkpoint["state_dict"].items()}
    torch.save(checkpoint, path)
    capsys.readouterr()
    sweep(["--from", str(logs), "--tasks", "zoo_cloze", "--suite-args", "--limit 8", "--baseline", "a"])
    evaluated = [line for line in capsys.readouterr().out.splitlines() if line.startswith("evaluating ")]
    assert evaluated == ["evaluating a seed 0: tasks (trained on since)"]  # the others' results are still theirs
    assert len(indexed) == 2 and not Path(indexed[1][0][0]).exists()  # the sweep's task folder, removed after it
    assert not shared_index_entries  # and no longer offered to a later evaluation
    again = json.loads((logs / "tasks_zoo_cloze" / "a_seed0.json").read_text())
    assert again["step"] == checkpoint["global_step"]
    assert again["harness"]["results"]["zoo_cloze"]["acc,none"] == scores["b", 0]
    # other settings: every result is scored again, not the stored one of 8 examples returned for 4
    sweep(["--from", str(logs), "--tasks", "zoo_cloze", "--suite-args", "--limit 4", "--baseline", "a"])
    evaluated = [line for line in capsys.readouterr().out.splitlines() if line.startswith("evaluating ")]
    assert evaluated == [f"evaluating {r} seed {s}: tasks (other settings)" for r in "ab" for s in (0, 1)]
    again = json.loads((logs / "tasks_zoo_cloze" / "a_seed0.json").read_text())
    assert again["settings"]["limit"] == 4 and again["harness"]["n-samples"]["zoo_cloze"]["effective"] == 4
    sweep(["--from", str(logs), "--tasks", "zoo_cloze", "--suite-args", "--limit 4", "--baseline", "a"])
    out = capsys.readouterr().out
    assert "evaluating " not in out and "note: stored scores" not in out  # the same settings: the stored results stand
    # scored by other code (a commit since): the scores stand, and a note says which, and how to score them again
    from recipes.code_version import code_label, code_version

    assert again["code"] == code_version()
    written = logs / "tasks_zoo_cloze" / "b_seed1.json"
    older = {**again["code"], "commit": "1" * 40, "edits": None}
    written.write_text(json.dumps({**json.loads(written.read_text()), "code": older}))
    sweep(["--from", str(logs), "--tasks", "zoo_cloze", "--suite-args", "--limit 4", "--baseline", "a"])
    out = capsys.readouterr().out
    assert "evaluating " not in out
    assert (f"note: stored scores reused from other code than this ({code_label([code_version()])}): 1111111, torch "
            f"{older['torch']}: b seed 1; delete {logs / 'tasks_zoo_cloze'}/ to score them again with this code") in out
    with pytest.raises(SystemExit, match="--suite or --tasks, one at a time"):
        sweep(["--from", str(logs), "--tasks", "zoo_cloze", "--suite", "length"])


def test_a_cloze_over_held_out_documents_asks_for_each_sentences_last_word(tmp_path, capsys):
    from recipes.data import TokenizedCorpus
    from recipes.evaluation.tasks import document_cloze_items, main as make_task

    documents = [f"Document {i} opens here. The quick brown fox number {i} jumps over the sleeping lazy "
                 f"{'dog' if i % 2 else 'cats'}. Then the {i}th story goes on for a while until it finally reaches the "
                 f"{['garden', 'river', 'market', 'harbour', 'castle'][i % 5]}." for i in range(40)]
    items = document_cloze_items(documents, count=100, seed=1)
    assert len(items) == 40  # one question per document
    for item in items:
        answer = item["choices"][item["answer"]].strip()
        assert answer in {"cats", "garden", "river", "market", "harbour", "castle"}  # "dog" is 3 letters: never asked
        source = next(d for d in documents if d.startswith(item["context"][:18]) or item["context"] in d)
        assert item["context"] + " " + answer + "." in source  # the context is the document's text up to the word,
        assert item["context"].startswith("Document ")  # from its start (these are shorter than 600 characters)
        assert len(set(item["choices"])) == 4
    with pytest.raises(ValueError, match="only 3 documents have a sentence a cloze can use"):
        document_cloze_items([*documents[:3], "Too short."])
    assert len(document_cloze_items(documents[:4])) == 4  # four documents are enough for four choices
    # a long document: the context is the 600 characters before the sentence, starting at a whole word
    filler = " ".join(f"w{i}" for i in range(400)) + "."  # 1,890 characters, one sentence too long to ask about
    long = filler + " The quick brown fox number one jumps over the sleeping lazy cats."
    [item] = [i for i in document_cloze_items([long, *documents[:3]]) if "fox number one" in i["context"]]
    before = item["context"].removesuffix(" The quick brown fox number one jumps over the sleeping lazy")
    assert before != item["context"] and filler.endswith(before) and before.startswith("w")
    assert 590 <= len(before) <= 600 and filler[-len(before) - 1] == " "
    edge = "Alpha beta gamma d. The quick brown fox number two jumps over the sleeping lazy cats."  # sentence at 20
    [item] = [i for i in document_cloze_items([edge, *documents[:3]], context_chars=20) if "fox number two" in i["context"]]
    assert item["context"].startswith("Alpha beta")  # a window from the document's start has no cut word to drop

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    data = TokenizedCorpus(str(corpus), val_fraction=0.25)
    assert list(data.documents("val")) == documents[3::4]  # every 4th document, as the token cache splits them
    assert list(data.documents("train")) == [d for i, d in enumerate(documents) if i % 4 != 3]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"data:\n  class_path: recipes.data.TokenizedCorpus\n  init_args: {{paths: {corpus}, val_fraction: 0.25}}\n")
    folder = make_task(["cloze", "--config", str(recipe), "--out", str(tmp_path / "tasks")])
    written = [json.loads(line) for line in (folder / "c_cloze.jsonl").read_text().splitlines()]
    assert len(written) == 10 and all(any(i["context"] in d for d in documents[3::4]) for i in written)
    assert "task: c_cloze" in (folder / "c_cloze.yaml").read_text()
    again = ["cloze", "--config", str(recipe), "--out", str(tmp_path / "tasks")]
    assert make_task(again) == folder  # the same questions again: nothing lost
    with pytest.raises(SystemExit, match=r"c_cloze.jsonl holds other questions of a task 'c_cloze' .*--force replaces"):
        make_task([*again, "--count", "4"])  # scores stored under the name were of the ten
    assert len((folder / "c_cloze.jsonl").read_text().splitlines()) == 10
    make_task([*again, "--count", "4", "--force"])
    assert len((folder / "c_cloze.jsonl").read_text().splitlines()) == 4
    with pytest.raises(SystemExit):
        make_task(["cloze", "--out", "x"])
    assert "the following arguments are required: --config" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        make_task(["cloze", "--config", str(recipe)])
    assert "the following arguments are required: --out" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--name 'c-cloze': a task name is letters, digits and underscores"):
        make_task(["cloze", "--config", str(recipe), "--out", str(tmp_path / "n"), "--name", "c-cloze"])
    text = tmp_path / "text.yaml"
    text.write_text("data:\n  class_path: recipes.data.TextCorpus\n")
    with pytest.raises(SystemExit, match="TextCorpus has no documents to build a cloze from"):
        make_task(["cloze", "--config", str(text), "--out", str(tmp_path / "t")])


def test_python_m_recipes_evaluation_tasks_is_the_command():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "recipes.evaluation.tasks", "cloze", "--out", "x"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "the following arguments are required: --config" in done.stderr, done.stderr


def test_the_length_figure_draws_each_mode_over_its_buckets_and_marks_the_training_length(tmp_path, monkeypatch):
    """Plain rows solid, NTK rows dashed, each bucket at its middle position; a grey line at the training length."""
    import recipes.evaluation.suites as suites

    drawn = kept_axes(monkeypatch, suites)
    rows = [{"mode": mode, "length": 96, "buckets": buckets} for mode, buckets in (("plain", [2.0, 3.0, 4.0]),
                                                                                  ("ntk", [2.0, 2.5, 2.6]))]
    suites.plot({"suite": "length", "trained": 32, "bucket": 32, "rows": rows}, tmp_path / "length.png")
    axes = drawn[-1]
    lines = {line.get_label(): line for line in axes.get_lines()}
    assert lines["plain, length 96"].get_linestyle() == "-" and lines["ntk, length 96"].get_linestyle() == "--"
    assert list(lines["ntk, length 96"].get_xdata()) == [16, 48, 80]
    assert list(lines["plain, length 96"].get_ydata()) == [2.0, 3.0, 4.0]
    marks = [line for label, line in lines.items() if label not in ("plain, length 96", "ntk, length 96")]
    assert [list(line.get_xdata()) for line in marks] == [[32, 32]]
    assert (tmp_path / "length.png").read_bytes()[:4] == b"\x89PNG"


def test_requests_longer_than_the_model_takes_are_counted_in_a_note(tmp_path, monkeypatch):
    """lm-eval's inputs longer than ``max_seq_len`` are cut from the left, as its Hugging Face model cuts them; a
    passkey cut off its key then scores chance, and the command said nothing. The note counts them."""
    from recipes.evaluation.cli import parser, run_harness

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # (where the zoo's task YAMLs are written)
    args = parser().parse_args(["--config", "-", "--ckpt_path", "-", "--tasks", "zoo_cloze", "--limit", "3"])
    results, _, note = run_harness(tiny(max_seq_len=16), BYTES, args)
    assert results["results"]["zoo_cloze"]["acc,none"] is not None
    assert note == ("note: 12 of 12 requests were longer than the model's max_seq_len=16 and were cut from the left, "
                    "as lm-eval's Hugging Face model cuts them: where the answer depends on what was cut (a passkey's "
                    "key), the score is chance's")
    assert run_harness(tiny(max_seq_len=4096), BYTES, args)[2] is None  # (every cloze context fits)


def test_an_imported_llama_whose_tokenizer_adds_its_bos_scores_and_generates_as_lm_evals_hugging_face_model(tmp_path):
    """lm-eval's Hugging Face model encodes with the model's tokenizer, whose post-processor puts ``<s>`` before every
    text (Llama's does); the zoo's adapter encoded without it, so an imported Llama was scored on text it never saw
    without its ``<s>``: 2.5e-2 off in a log-likelihood, 5.5 in a rolling one, and another greedy answer. The import
    makes ``<s>`` the corpus's start of document, which the adapter puts first: the same numbers, on the same
    weights."""
    transformers = pytest.importorskip("transformers")
    from lm_eval.models.huggingface import HFLM
    from tokenizers import processors

    from recipes.data import TokenizedCorpus
    from recipes.hf import from_pretrained
    from recipes.hf.tokenizer import byte_tokenizer, corpus_settings

    folder = tmp_path / "llama"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=258, hidden_size=32, num_hidden_layers=2, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, bos_token_id=256, eos_token_id=257)).save_pretrained(folder)
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(["<s>", "</s>"])  # 256, 257
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 256)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "bos_token": "<s>", "eos_token": "</s>"}))
    theirs = HFLM(pretrained=str(folder), batch_size=4, device="cpu", dtype="float32")
    assert theirs.tok_encode("ab") == [256, 97, 98]
    data = TokenizedCorpus(tokenizer=str(folder / "tokenizer.json"), **corpus_settings(folder, tokenizer, 258))
    ours = ZooLM(from_pretrained(folder).eval(), data, batch_size=3)
    assert ours.tok_encode("ab") == [256, 97, 98] and ours.prefix_token_id == 256
    pairs = [("The cat", " sat"), ("", "hello"), ("Question: 2+2?", " 4"), ("x", "yz")]
    want = theirs.loglikelihood([request("loglikelihood", *p) for p in pairs], disable_tqdm=True)
    got = ours.loglikelihood([request("loglikelihood", *p) for p in pairs], disable_tqdm=True)
    assert [s for s, _ in got] == pytest.approx([s for s, _ in want], abs=1e-4)
    assert [g for _, g in got] == [g for _, g in want]
    text = [request("loglikelihood_rolling", "hello world, a longer text " * 3)]
    assert ours.loglikelihood_rolling(text) == pytest.approx(theirs.loglikelihood_rolling(text, disable_tqdm=True), abs=1e-3)
    asks = [request("generate_until", c, {"until": ["\n\n"], "max_gen_toks": 12}) for c in ("Once", "The cat sat")]
    assert ours.generate_until(asks) == theirs.generate_until(asks, disable_tqdm=True)
