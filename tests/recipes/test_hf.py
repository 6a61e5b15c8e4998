"""Hugging Face checkpoints load into the zoo and give the same logits and gradients: Llama, Mamba-2 and
Doge (dense and CDMoE), tiny random models built with ``transformers`` (a dev extra), saved to a
temporary folder with ``save_pretrained``, loaded with :func:`recipes.hf.from_pretrained`."""

import json
import re

import numpy as np
import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers", reason="the Hugging Face parity tests need `pip install -e .[dev]`")

from recipes.hf import from_pretrained, hf_recipe, main  # noqa: E402

VOCAB, T = 97, 19


def randomize(model: torch.nn.Module) -> None:
    """Move the parameters Hugging Face initialises to constants (norm gains, residual scales, Doge's A,
    Mamba's D, the projections' biases, which start at zero) away from them, so a weight mapped to the wrong place
    cannot hide; and give Mamba-2's step a size
    at which its state matters (at the initial Δ of 0.001-0.1 the skip D·x outweighed it so that a decoding state
    halved at every step stayed within 1e-5 of Hugging Face's logits)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", "_residual", "norm_f.weight", ".D")):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".A"):
                p.uniform_(-1.0, 1.0)
            elif name.endswith("dt_bias"):
                p.uniform_(0.0, 1.0)  # Δ = softplus: 0.7-1.3
            elif name.endswith("A_log"):
                p.uniform_(-2.0, 0.0)  # a = -exp: decays exp(Δ·a) of 0.3-0.9 a step
            elif name.endswith("proj.bias"):
                p.uniform_(-0.5, 0.5)


def build(kind: str, **settings):
    torch.manual_seed(0)
    common = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, **settings}
    common.setdefault("tie_word_embeddings", kind in ("doge", "doge-moe"))
    if kind == "llama":
        config = transformers.LlamaConfig(**common, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=64, rms_norm_eps=1e-5)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "mamba2":
        config = transformers.Mamba2Config(**common, num_heads=8, head_dim=8, expand=2, state_size=16, n_groups=2,
                                           chunk_size=8, conv_kernel=4)
        model = transformers.Mamba2ForCausalLM(config)
    else:
        config = transformers.DogeConfig(**{"tie_word_embeddings": True, "num_experts_per_tok": 3, **common},
                                         intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, keep_window_size=64, is_moe=kind == "doge-moe",
                                         num_experts=16)
        model = transformers.DogeForCausalLM(config)
    model.config._attn_implementation = "eager"
    randomize(model)
    return model.eval()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


# A gradient is a long fp32 sum that the two implementations order differently, and the CPU's kernels order again:
# 1e-4 held on every earlier session's machine, an AMD EPYC gives up to 1.4e-4 (Doge's A, OLMo-Hybrid's
# out_proj). A wrong formula moves a gradient by 1e-2 or more.
GRADIENT_TOLERANCE = 5e-4


def saved(tmp_path, kind):
    hf = build(kind)
    hf.save_pretrained(tmp_path / kind)
    return hf, from_pretrained(tmp_path / kind).eval()


def left_padded_batch():
    ids = torch.randint(0, VOCAB, (3, T))
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, :5], mask[2, :11] = 0, 0
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids, mask, positions


@pytest.mark.parametrize("kind", ["llama", "mamba2", "doge"])
def test_logits_and_every_gradient_equal_hugging_face(tmp_path, kind):
    hf, zoo = saved(tmp_path, kind)
    ids = torch.randint(0, VOCAB, (2, T))
    want = hf(ids).logits
    got = zoo(ids)
    assert relative_error(got, want) <= 1e-5

    # Left padding: the logits of the real tokens are the same.
    ids, mask, positions = left_padded_batch()
    extra = {} if kind == "mamba2" else {"position_ids": positions}
    want = hf(ids, attention_mask=mask, **extra).logits
    got = zoo(ids, padding_mask=mask == 0, position_ids=positions)
    valid = mask.bool()
    assert relative_error(got[valid], want[valid]) <= 1e-5

    # Every weight's gradient, through a loss on the real tokens.
    target = torch.randn_like(want)
    (want[valid] * target[valid]).sum().backward()
    (got[valid] * target[valid]).sum().backward()
    zoo_grads = dict(zoo.named_parameters())
    checked = 0
    for name, p in hf.named_parameters():
        if p.grad is None:
            continue
        mine = mapped_gradient(kind, name, zoo_grads, hf.config)
        if mine is None:
            continue
        assert relative_error(mine, p.grad) <= GRADIENT_TOLERANCE, name
        checked += 1
    assert checked == sum(p.grad is not None for p in hf.parameters())


def mapped_gradient(kind, name, zoo, config):
    """The zoo's gradient for the Hugging Face parameter ``name`` (sliced where one is fused)."""
    import re

    grad = lambda ours: zoo[ours].grad  # noqa: E731
    if name in ("model.embed_tokens.weight", "backbone.embeddings.weight"):
        return grad("embedding.weight")
    if name in ("model.norm.weight", "backbone.norm_f.weight"):
        return grad("norm.weight")
    if name == "lm_head.weight":
        return grad("lm_head.weight")
    i, rest = re.match(r"(?:model|backbone)\.layers\.(\d+)\.(.+)", name).groups()
    b = f"blocks.{i}"
    if kind == "mamba2":
        d_inner, conv = 64, 64 + 2 * config.n_groups * config.state_size
        if rest == "mixer.in_proj.weight":
            xbc, dt, z = grad(f"{b}.sequence_mixer.in_proj.weight").split([conv, config.num_heads, d_inner])
            return torch.cat([z, xbc, dt])
        table = {"norm.weight": "sequence_norm.weight", "mixer.conv1d.weight": "sequence_mixer.conv.weight",
                 "mixer.conv1d.bias": "sequence_mixer.conv.bias", "mixer.norm.weight": "sequence_mixer.gate_norm.weight"}
        return grad(f"{b}.{table.get(rest, rest.replace('mixer.', 'sequence_mixer.'))}")
    table = {"input_layernorm.weight": "sequence_norm.weight", "post_attention_layernorm.weight": "state_norm.weight",
             "self_attn.q_proj.weight": "sequence_mixer.q_proj.weight", "self_attn.o_proj.weight": "sequence_mixer.out_proj.weight",
             "self_attn.k_proj.weight": "sequence_mixer.k_proj.weight", "self_attn.v_proj.weight": "sequence_mixer.value.weight",
             "self_attn.dt_proj.weight": "sequence_mixer.key_bias.delta_proj.weight", "self_attn.A": "sequence_mixer.key_bias.A",
             "self_attn.q_norm.weight": "sequence_mixer.positions.q_norm.weight",
             "self_attn.k_norm.weight": "sequence_mixer.positions.k_norm.weight",
             "input_residual": "sequence_residual", "post_attention_residual": "state_residual",
             "mlp.down_proj.weight": "state_mixer.out_proj.weight"}
    if kind == "llama" and rest in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        k, v = grad(f"{b}.sequence_mixer.kv_proj.weight").chunk(2)
        return k if "k_proj" in rest else v
    if rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
        gate, up = grad(f"{b}.state_mixer.in_proj.weight").chunk(2)
        return gate if "gate" in rest else up
    return grad(f"{b}.{table[rest]}")


def decode_one_token_at_a_time(hf, ids: torch.Tensor) -> torch.Tensor:
    """Hugging Face's logits ``[B, T, V]`` for ``ids`` ``[B, T]``, fed one token a step through its cache. The cache
    keyword is ``cache`` in recent transformers (``past_key_values`` is deprecated there) and
    ``past_key_values`` before: whichever the installed model's forward takes."""
    import inspect

    keyword = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    cache, steps = None, []
    for t in range(ids.shape[1]):
        out = hf(ids[:, t:t + 1], use_cache=True, position_ids=torch.tensor([[t]]), **{keyword: cache})
        cache = out.past_key_values
        steps.append(out.logits[:, -1])
    return torch.stack(steps, dim=1)


def test_doges_kept_window_equals_hugging_face_once_the_sequence_is_longer_than_the_window(tmp_path):
    # keep_window_size=6 < T: each query keeps its 6 keys of largest bias, with and without left padding. The first
    # layer's bias is a function of the token alone, so a token that repeats ties with itself, and Hugging Face's
    # `topk` breaks ties as its kernel happens to (the zoo keeps the most recent key, docs/architectures.md): each
    # row's tokens are distinct here, so no tie decides.
    torch.manual_seed(0)
    config = transformers.DogeConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=48,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     keep_window_size=6)
    hf = transformers.DogeForCausalLM(config)
    hf.config._attn_implementation = "eager"
    randomize(hf)
    hf.eval().save_pretrained(tmp_path / "doge")
    zoo = from_pretrained(tmp_path / "doge").eval()
    ids = torch.stack([torch.randperm(VOCAB)[:T] for _ in range(3)])  # [3, T], no token twice in a row
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, :5], mask[2, :11] = 0, 0  # row 2: 8 real tokens, more than the window
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    valid = mask.bool()
    with torch.no_grad():
        assert relative_error(zoo(ids), hf(ids).logits) <= 1e-5
        want = hf(ids, attention_mask=mask, position_ids=positions).logits
        got = zoo(ids, padding_mask=mask == 0, position_ids=positions)
        assert relative_error(got[valid], want[valid]) <= 1e-5
        # The window cuts: every key kept is another model.
        for block in zoo.blocks:
            block.sequence_mixer.keep_window = None
        assert relative_error(zoo(ids), hf(ids).logits) > 1e-3


def test_an_exported_doge_that_keeps_every_key_keeps_them_past_its_length_in_transformers(tmp_path):
    # A Doge that extrapolates (dynamic NTK) and keeps every key was exported with keep_window_size = max_seq_len,
    # and transformers windowed every longer sequence: 0.18 (relative) away from the zoo at 1.5 times the length.
    from components import HybridLM
    from recipes.hf import export

    torch.manual_seed(0)
    recipe = hf_recipe({"architectures": ["DogeForCausalLM"], "vocab_size": VOCAB, "hidden_size": 32,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "intermediate_size": 48, "rms_norm_eps": 1e-6, "max_position_embeddings": 16,
                        "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    recipe["mixers"]["I"]["init_args"]["keep_window"] = None
    zoo = HybridLM(**recipe).eval()
    randomize(zoo)
    export(zoo, tmp_path / "exported")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    theirs.config._attn_implementation = "eager"
    ids = torch.stack([torch.randperm(VOCAB)[:24] for _ in range(2)])  # [2, 24]: past max_seq_len = 16
    with torch.no_grad():
        assert relative_error(zoo(ids), theirs(ids).logits) <= 1e-5


@pytest.mark.parametrize("settings", [{}, {"num_experts_per_tok": 6},  # 6 of 16: more than a key half's 4
                                      {"norm_topk_prob": True}])  # (a softmax's sum is 1: it changes nothing)
def test_doge_moe_equals_hugging_face_decoding_one_token_at_a_time(tmp_path, settings):
    # Hugging Face's DogeCDMoE reshapes its router logits across tokens in a full forward (its own
    # comment says so); one token at a time it computes the per-token math, which the zoo implements.
    # (The last two settings were refused at import.)
    hf = build("doge-moe", **settings)
    hf.save_pretrained(tmp_path / "doge-moe")
    zoo = from_pretrained(tmp_path / "doge-moe").eval()
    ids = torch.randint(0, VOCAB, (1, T))
    got = zoo(ids)
    with torch.no_grad():
        want = decode_one_token_at_a_time(hf, ids)
    assert relative_error(got, want) <= 1e-5
    if settings:  # (Hugging Face's own backward fails with norm_topk_prob: an in-place division of its softmax)
        return
    # One token in a full forward is the per-token math too: every gradient agrees there.
    hf.zero_grad(), zoo.zero_grad()
    one = ids[:, :1]
    target = torch.randn(1, 1, VOCAB)
    (hf(one).logits * target).sum().backward()
    (zoo(one) * target).sum().backward()
    ours = dict(zoo.named_parameters())
    for i in range(2):
        layer, block = hf.model.layers[i].mlp, f"blocks.{i}.state_mixer"
        for theirs, mine in ((layer.router_gate.weight, "router.weight"), (layer.down_embed.weight, "down"),
                             (layer.up_embed.weight, "up"), (layer.down_proj.weight, "shared.out_proj.weight")):
            assert relative_error(ours[f"{block}.{mine}"].grad, theirs.grad) <= GRADIENT_TOLERANCE, mine


def with_tokenizer(tmp_path, kind: str = "llama"):
    """A model of the byte tokenizer's size (256 bytes + the end-of-document token) saved with that tokenizer."""
    from recipes.hf.tokenizer import END_OF_DOCUMENT, byte_tokenizer

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=257, hidden_size=32, num_hidden_layers=2, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64)).eval()
    hf.save_pretrained(tmp_path / kind)
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens([END_OF_DOCUMENT])
    tokenizer.save(str(tmp_path / kind / "tokenizer.json"))
    return hf


def test_recipe_and_fine_tuning_checkpoint(tmp_path, capsys):
    import yaml

    from recipes import LanguageModel

    hf = with_tokenizer(tmp_path)
    recipe = hf_recipe(tmp_path / "llama")
    assert recipe["pattern"] == "AM×2" and recipe["mixers"]["A"]["init_args"] == {"n_heads": 4, "n_kv_heads": 2}
    main([str(tmp_path / "llama"), "--out", str(tmp_path / "out" / "llama.ckpt")])
    assert "fine-tune: python -m recipes fit --config" in capsys.readouterr().out
    lm = LanguageModel.load_from_checkpoint(tmp_path / "out" / "llama.ckpt")
    ids = torch.randint(0, 257, (1, 7))
    torch.testing.assert_close(lm.model(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
    config = yaml.safe_load((tmp_path / "out" / "llama.yaml").read_text())
    assert list(config) == ["seed_everything", "model", "data", "trainer"]  # in the order a reader looks for them
    assert config["trainer"]["logger"]["init_args"] == {"save_dir": "runs", "name": "finetune/llama",
                                                        "default_hp_metric": False}
    assert config["model"]["init_from"] == "llama.ckpt"  # relative to the recipe, which then works from any folder
    assert config["data"]["class_path"] == "recipes.data.TokenizedCorpus"  # the folder's tokenizer comes along
    model_args = {k: v for k, v in config["model"].items() if k != "lr"}
    started = LanguageModel(**{**model_args, "init_from": str(tmp_path / "out" / "llama.ckpt")})
    assert "init_from: loaded 17 tensors from" in capsys.readouterr().out
    torch.testing.assert_close(started.model(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
    deeper = tmp_path / "new" / "modèle" / "llama.ckpt"  # its folders made; its path written as it is, not escaped
    main([str(tmp_path / "llama"), "--out", str(deeper)])
    assert f"tokenizer: {deeper.parent.resolve() / 'llama.tokenizer.json'}\n" in deeper.with_suffix(".yaml").read_text()


def test_a_written_recipe_finds_its_checkpoint_from_any_folder(tmp_path, monkeypatch, capsys):
    from recipes.cli import main as cli

    hf = with_tokenizer(tmp_path)
    main([str(tmp_path / "llama"), "--out", str(tmp_path / "out" / "llama.ckpt")])
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(30)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run = cli(["--config", str(tmp_path / "out" / "llama.yaml"), "--data.init_args.paths", str(tmp_path / "text" / "a.jsonl"),
               "--data.init_args.cache_dir", str(tmp_path / "cache")], run=False)
    ids = torch.randint(0, 257, (1, 7))
    torch.testing.assert_close(run.model.model(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
    assert f"init_from: loaded 17 tensors from {tmp_path / 'out' / 'llama.ckpt'}" in capsys.readouterr().out


def test_an_imported_model_generates_and_is_evaluated_before_any_corpus_is_there(tmp_path, monkeypatch, capsys):
    """The written recipe's corpus (data/*.jsonl) is yours to fill in; generating or scoring lm-eval tasks needs only
    its tokenizer file (it was "TokenizedCorpus: the pattern 'data/*.jsonl' matches no file")."""
    from recipes.data import TokenizedCorpus
    from recipes.evaluation.cli import main as evaluate
    from recipes.generate import main as generate

    hf = with_tokenizer(tmp_path)
    main([str(tmp_path / "llama"), "--out", str(tmp_path / "out" / "llama.ckpt")])
    monkeypatch.chdir(tmp_path / "out")
    assert not (tmp_path / "out" / "data").exists()
    text = generate(["--config", "llama.yaml", "--ckpt_path", "llama.ckpt", "--prompt", "ab", "--max_new_tokens", "6"])
    # Hugging Face's own greedy continuation: after its beginning-of-sequence token (config.json's 1, which its
    # tokenizer would add), up to its end-of-sequence token (2), which the recipe's documents end with
    settings = yaml.safe_load((tmp_path / "out" / "llama.yaml").read_text())["data"]["init_args"]
    data = TokenizedCorpus(tokenizer=str(tmp_path / "out" / "llama.tokenizer.json"),
                           **{k: settings[k] for k in ("start_of_document_token", "end_of_document_token")})
    assert (data.start_of_document, data.end_of_document) == (1, 2)
    expected = hf.generate(torch.tensor([[1, 97, 98]]), max_new_tokens=6, do_sample=False, pad_token_id=0,
                           attention_mask=torch.ones(1, 3, dtype=torch.long))[0, 3:].tolist()
    assert text == data.decode([97, 98] + (expected[:expected.index(2)] if 2 in expected else expected))
    scores = evaluate(["--config", "llama.yaml", "--ckpt_path", "llama.ckpt", "--tasks", "zoo_cloze", "--limit", "4"])
    assert 0 <= scores["harness"]["results"]["zoo_cloze"]["acc,none"] <= 1


@pytest.mark.parametrize("model_vocab", [258, 264], ids=["exact", "padded"])
def test_an_imported_model_fine_tunes_with_its_own_end_of_sequence_token_and_embedding_size(tmp_path, monkeypatch, capsys,
                                                                                             model_vocab):
    """A Llama-like folder: the tokenizer has <s> and </s> (eos) and no <|endoftext|>, the embedding may be padded past
    the tokenizer. Documents end with </s> and the model keeps its size (the corpus added <|endoftext|> as token 258
    and the linked vocabulary no longer fit the checkpoint: "init_from … does not fit this model")."""
    from recipes.cli import main as cli
    from recipes.hf.tokenizer import byte_tokenizer

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=model_vocab, hidden_size=32, num_hidden_layers=1, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, eos_token_id=257)).save_pretrained(tmp_path / "llama")
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(["<s>", "</s>"])  # ids 256, 257
    tokenizer.save(str(tmp_path / "llama" / "tokenizer.json"))
    (tmp_path / "llama" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>"}))
    main([str(tmp_path / "llama"), "--out", str(tmp_path / "out" / "llama.ckpt")])
    (tmp_path / "out" / "data").mkdir()
    (tmp_path / "out" / "data" / "a.jsonl").write_text("".join(json.dumps({"text": f"note {i} " * 12}) + "\n" for i in range(40)))
    monkeypatch.chdir(tmp_path / "out")
    run = cli(["--config", "llama.yaml", "--data.init_args.seq_len", "16", "--data.init_args.batch_size", "2",
               "--data.init_args.cache_dir", str(tmp_path / "cache")], run=False)
    assert run.model.model.vocab_size == model_vocab and "init_from: loaded 10 tensors" in capsys.readouterr().out
    run.datamodule.setup()
    assert run.datamodule.end_of_document == run.datamodule.meta["end_of_document"] == 257  # </s>, nothing added
    assert run.datamodule.start_of_document == 256  # <s>: Llama's documents began with it
    tokens = np.fromfile(run.datamodule.cache / "train.bin", dtype=run.datamodule.meta["dtype"])
    assert int(tokens.max()) == 257 and (tokens == 257).sum() == (tokens == 256).sum() == run.datamodule.meta["documents"]["train"]
    assert tokens[0] == 256 and tokens[-1] == 257
    # exported again, the folder says so as it did
    with pytest.raises(SystemExit, match=r"error: --as Qwen3ForCausalLM: this model \(pattern '.*'\) is not one: its "
                                         "attention has no RoPE or no QK-norm"):
        main(["export", "--config", "llama.yaml", "--ckpt_path", "llama.ckpt", "--out", "as-qwen3", "--as",
              "Qwen3ForCausalLM"])
    main(["export", "--config", "llama.yaml", "--ckpt_path", "llama.ckpt", "--out", "again", "--as", "MistralForCausalLM"])
    assert json.loads((tmp_path / "out" / "again" / "config.json").read_text())["architectures"] == ["MistralForCausalLM"]
    config = json.loads((tmp_path / "out" / "again" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (256, 257)
    written = json.loads((tmp_path / "out" / "again" / "tokenizer_config.json").read_text())
    assert (written["bos_token"], written["eos_token"]) == ("<s>", "</s>")


def test_an_import_whose_tokenizer_outgrows_the_model_is_refused(tmp_path):
    from recipes.hf import write_checkpoint
    from recipes.hf.tokenizer import byte_tokenizer

    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=257, hidden_size=32, num_hidden_layers=1, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, bos_token_id=None, eos_token_id=None)).save_pretrained(tmp_path / "llama")
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(["<pad>"])  # 257 tokens and no end-of-sequence token: <|endoftext|> would be 258th
    tokenizer.save(str(tmp_path / "llama" / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"the tokenizer has 258 tokens once <\|endoftext\|> is added to end documents "
                                         r"\(the folder names no end-of-sequence token it has\), more than the model's 257"):
        write_checkpoint(tmp_path / "llama", tmp_path / "out" / "llama.ckpt")


def test_the_end_of_sequence_token_and_the_embedding_padding_an_import_reads_from_a_folder(tmp_path):
    """``tokenizer_config.json``'s ``eos_token`` first, else ``config.json``'s ``eos_token_id`` (an int or a list);
    ``padded_vocab_size`` only where the model has more rows than the tokenizer needs; a 256-token tokenizer is
    bytes only if it encodes text to its bytes."""
    from tokenizers import Tokenizer, models

    from recipes.hf.tokenizer import byte_tokenizer, corpus_settings, folder_special_token, is_byte_tokenizer

    words = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(256)}, unk_token="w0"))
    assert not is_byte_tokenizer(words) and is_byte_tokenizer(byte_tokenizer()) and not is_byte_tokenizer(byte_tokenizer(257))
    folder = tmp_path / "folder"
    folder.mkdir()
    assert folder_special_token(folder, words, "eos") is None and corpus_settings(folder, words, 257) == {}  # <|endoftext|> added
    (folder / "config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    assert folder_special_token(folder, words, "eos") == "w7"
    assert corpus_settings(folder, words, 300) == {"end_of_document_token": "w7", "padded_vocab_size": 300}
    assert corpus_settings(folder, words, 256) == {"end_of_document_token": "w7"}
    (folder / "config.json").write_text(json.dumps({"eos_token_id": [7, 8], "bos_token_id": 7}))  # one token: no start
    assert corpus_settings(folder, words, 256) == {"end_of_document_token": "w7"}
    (folder / "config.json").write_text(json.dumps({"eos_token_id": [7, 8], "bos_token_id": 5}))
    assert corpus_settings(folder, words, 256) == {"end_of_document_token": "w7", "start_of_document_token": "w5"}
    (folder / "config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "w9"}}))
    assert folder_special_token(folder, words, "eos") == "w9"
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))  # a token the tokenizer lacks
    assert folder_special_token(folder, words, "eos") == "w7"  # config.json's, then
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 999}))  # an id past the vocabulary: none
    assert folder_special_token(folder, words, "eos") is None
    (folder / "config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    with pytest.raises(ValueError, match=r"the tokenizer has 256 tokens, more than the model's 200 embedding rows"):
        (folder / "tokenizer_config.json").unlink()
        corpus_settings(folder, words, 200)


def test_a_byte_level_model_exported_and_imported_again_fine_tunes_on_bytes(tmp_path, monkeypatch):
    from recipes.cli import main as cli

    monkeypatch.chdir(tmp_path)
    cli(["fit", "--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
         "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false"])
    main(["export", "--config", "quickstart.yaml", "--ckpt_path", "last", "--out", "exported"])  # as generate spells it
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
    text = "a , b . c 's é€\n"  # (transformers 4 "cleans up" the spaces before , . 's unless told not to)
    assert exported(text)["input_ids"] == list(text.encode()) and exported.decode(list(text.encode())) == text
    assert json.loads((tmp_path / "exported" / "tokenizer_config.json").read_text())["clean_up_tokenization_spaces"] is False
    main(["import", "exported", "--out", "again.ckpt"])  # its tokenizer.json is bytes, with no end-of-document token
    assert yaml.safe_load((tmp_path / "again.yaml").read_text())["data"]["class_path"] == "recipes.data.TextCorpus"
    run = cli(["--config", "again.yaml"], run=False)  # (it was a 257-token corpus for the 256-row checkpoint)
    assert run.model.model.vocab_size == 256


def test_export_names_a_missing_or_ambiguous_checkpoint_and_trusts_the_recipes_own_classes(tmp_path, monkeypatch):
    from recipes.cli import main as cli

    with pytest.raises(SystemExit, match="2"):
        main(["export", "--out", "x"])  # which checkpoint? (argparse's usage error)
    with pytest.raises(SystemExit, match="2"):
        main(["export", "a.ckpt", "--ckpt_path", "b.ckpt", "--out", "x"])
    with pytest.raises(SystemExit, match=r"last: the newest last.ckpt of which recipe's runs\? give --config RECIPE"):
        main(["export", "last", "--out", "x"])
    # A recipe binding a class of the user's own package: the recipe's checkpoint is read as generate and eval read
    # it (the recipe is trusted), so the export reaches its own reason, not the checkpoint's class refusal.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "usermix.py").write_text("from components import MLP\n\nclass Wide(MLP):\n    pass\n")
    (tmp_path / "mine.yaml").write_text("model: {d_model: 32, pattern: 'AW', mixers: {A: {class_path: components.QCAttention, "
                                        "init_args: {n_heads: 2}}, W: {class_path: usermix.Wide}}}\n"
                                        "data: {class_path: recipes.data.TextCorpus, init_args: {seq_len: 32}}\n")
    cli(["fit", "--config", "mine.yaml", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
         "--trainer.enable_progress_bar", "false"])
    [checkpoint] = tmp_path.glob("lightning_logs/*/checkpoints/last.ckpt")
    with pytest.raises(SystemExit, match="may name classes from components, torch.optim only"):
        main(["export", str(checkpoint), "--out", "x"])
    (tmp_path / "loose.ckpt").write_bytes(checkpoint.read_bytes())  # outside its run: no config.yaml says its data
    with pytest.raises(SystemExit, match="loose.ckpt is not in a run folder with a config.yaml: give --config RECIPE, "
                                         "whose data module's tokenizer goes with the model"):
        main(["export", "loose.ckpt", "--out", "x"])
    with pytest.raises(SystemExit, match="has no Hugging Face class"):
        main(["export", "--config", "mine.yaml", "--ckpt_path", "last", "--out", "x"])


def test_an_imported_model_is_exported_again_with_its_tokenizer_before_any_corpus_is_there(tmp_path, monkeypatch,
                                                                                           capsys):
    """The written recipe's corpus (data/*.jsonl) need not exist: an export takes only its tokenizer file, and says
    so (it said "the corpus's BPE", as if one had been trained)."""
    with_tokenizer(tmp_path)
    monkeypatch.chdir(tmp_path)
    main(["import", "llama", "--out", "out/llama.ckpt"])
    main(["export", "out/llama.ckpt", "--config", "out/llama.yaml", "--out", "exported"])
    assert f"tokenizer: the recipe's file {tmp_path.resolve() / 'out' / 'llama.tokenizer.json'}" in capsys.readouterr().out
    ours, theirs = (transformers.AutoTokenizer.from_pretrained(tmp_path / f) for f in ("exported", "llama"))
    text = "a , b . c 's é€<|endoftext|>"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"] == [*text[:-13].encode(), 256]
    assert ours.convert_tokens_to_ids(ours.eos_token) == 2  # the folder's config.json eos_token_id (Llama's default)


def test_the_command_line_names_a_missing_command_out_folder_or_checkpoint(tmp_path, monkeypatch, capsys):
    for argv, message in [([], "the following arguments are required: command"),
                          (["import", "folder"], "the following arguments are required: --out"),
                          (["export", "a.ckpt"], "the following arguments are required: --out")]:
        with pytest.raises(SystemExit, match="2"):
            main(argv)
        assert message in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # (a missing file, not "give --config RECIPE": that one is not in a run folder either)
    with pytest.raises(SystemExit, match="error: gone.ckpt: no such checkpoint file"):
        main(["export", "gone.ckpt", "--out", "x"])


def test_import_brings_the_folders_tokenizer_and_refuses_bytes_for_a_larger_vocabulary(tmp_path):
    import yaml
    from tokenizers import Tokenizer

    from recipes.hf import write_checkpoint

    with_tokenizer(tmp_path)
    _, recipe = write_checkpoint(tmp_path / "llama", tmp_path / "out" / "llama.ckpt")
    data = yaml.safe_load(recipe.read_text())["data"]
    assert data["class_path"] == "recipes.data.TokenizedCorpus"
    assert Tokenizer.from_file(data["init_args"]["tokenizer"]).encode("abc").ids == [97, 98, 99]
    big = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1,
                                                                 intermediate_size=48, num_attention_heads=4))
    big.save_pretrained(tmp_path / "big")
    with pytest.raises(ValueError, match=r"no tokenizer.json, and the model's vocabulary \(300 tokens\) is not bytes"):
        write_checkpoint(tmp_path / "big", tmp_path / "out" / "big.ckpt")


def test_import_never_replaces_an_edited_recipe_or_a_checkpoint_unless_forced(tmp_path, capsys):
    with_tokenizer(tmp_path)
    out = tmp_path / "out" / "llama.ckpt"
    main([str(tmp_path / "llama"), "--out", str(out)])
    recipe = out.with_suffix(".yaml")
    recipe.write_text(recipe.read_text().replace("data/*.jsonl", "my/own/*.jsonl"))  # the user points it at their data
    with pytest.raises(SystemExit, match=r"llama.ckpt, .*llama.yaml and .*llama.tokenizer.json already exist: choose another --out, or --force"):
        main([str(tmp_path / "llama"), "--out", str(out)])
    assert "my/own/*.jsonl" in recipe.read_text()
    main([str(tmp_path / "llama"), "--out", str(out), "--force"])
    assert "data/*.jsonl" in recipe.read_text()
    with pytest.raises(SystemExit, match=r"--out .*other.yaml: the checkpoint to write \(such as other.ckpt\)"):
        main([str(tmp_path / "llama"), "--out", str(tmp_path / "other.yaml")])
    assert not (tmp_path / "other.yaml").exists()


def test_export_into_a_folder_with_files_is_refused_and_forced_leaves_no_stale_shard(tmp_path):
    from recipes.data.text import TextCorpus
    from recipes.hf import export

    _, zoo = saved(tmp_path, "llama")
    export(zoo, tmp_path / "exported", data=TextCorpus(), max_shard_size="20KB")
    with torch.no_grad():
        for p in zoo.parameters():
            p.mul_(0.5)  # a different model, exported over the first
    with pytest.raises(FileExistsError, match="exported is not empty: choose a new folder, or --force"):
        export(zoo, tmp_path / "exported", data=TextCorpus())
    for size, problem in (("0", "is under one byte"), ("lots", "is not a size such as 2GB")):  # nothing cleared
        with pytest.raises(ValueError, match=f"max_shard_size '{size}' {problem}"):
            export(zoo, tmp_path / "exported", data=TextCorpus(), max_shard_size=size, overwrite=True)
        assert len(list((tmp_path / "exported").glob("model-*"))) > 1
    (tmp_path / "exported" / "notes.txt").write_text("mine")
    export(zoo, tmp_path / "exported", data=TextCorpus(), overwrite=True)  # one file now: the shards must go
    assert not list((tmp_path / "exported").glob("model-*")) and (tmp_path / "exported" / "notes.txt").exists()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert json.loads((tmp_path / "exported" / "generation_config.json").read_text()) == {
        "_from_model_config": True, "bos_token_id": config["eos_token_id"], "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"]}
    (tmp_path / "made").mkdir()
    export(zoo, tmp_path / "made", data=TextCorpus())  # a folder made beforehand, empty: no --force needed
    export(zoo, tmp_path / "new" / "deeper", data=TextCorpus())  # its folders made
    assert (tmp_path / "made" / "config.json").is_file() and (tmp_path / "new" / "deeper" / "config.json").is_file()
    (tmp_path / "file").write_text("mine")
    with pytest.raises(FileExistsError, match="file is a file: the export writes a folder"):
        export(zoo, tmp_path / "file")
    with pytest.raises(TypeError, match="export: OrderedDict is not a HybridLM, a LanguageModel or a checkpoint path"):
        export(zoo.state_dict(), tmp_path / "weights")
    assert not (tmp_path / "weights").exists()
    ids = torch.randint(0, VOCAB, (1, T))
    with torch.no_grad():
        assert relative_error(zoo(ids), theirs(ids).logits) <= 1e-5


@pytest.mark.parametrize("kind", ["llama", "mamba2", "doge", "doge-moe"])
def test_export_loads_in_transformers_with_equal_logits_and_greedy_ids(tmp_path, kind):
    from recipes.data.text import TextCorpus
    from recipes.hf import export

    _, zoo = saved(tmp_path, kind)
    export(zoo, tmp_path / "exported", data=TextCorpus(), max_shard_size="20KB")  # sharded past 20 kB
    assert (tmp_path / "exported" / "model.safetensors.index.json").is_file()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    theirs.config._attn_implementation = "eager"
    ids = torch.randint(0, VOCAB, (2, T))
    with torch.no_grad():
        ours = zoo(ids)
        if kind == "doge-moe":  # Hugging Face's Doge-MoE forward differs from its own decoding; its decoding is the math
            ids = ids[:1]  # (and its decoding, too, mixes the rows of a batch)
            ours = zoo(ids)
            logits = decode_one_token_at_a_time(theirs, ids)
        else:
            logits = theirs(ids).logits
        assert relative_error(ours, logits) <= 1e-5
        if kind != "doge-moe":  # (Hugging Face's Doge-MoE prefill is its full forward, which is not the math)
            prompt = ids[:1, :5]
            greedy = theirs.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
            assert zoo.generate(prompt, 6).tolist() == greedy.tolist()
    again = from_pretrained(tmp_path / "exported")
    for (name, a), b in zip(zoo.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name  # import(export(model)) is the model exactly
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
    assert tokenizer("héllo, wörld")["input_ids"] == TextCorpus.encode("héllo, wörld")
    written = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert ("rope_theta" in written) == ("max_position_embeddings" in written) == (kind != "mamba2")  # (no positions)
    spaced = "a , b . c ' d n't"  # decoded as the bytes were: no clean-up of the spaces before punctuation
    assert tokenizer.decode(TextCorpus.encode(spaced)) == spaced


@pytest.mark.parametrize("kind, act", [("llama", "gelu"), ("doge", "relu"), ("doge-moe", "gelu")])
def test_a_swiglu_with_another_activation_exports_as_the_hidden_act_it_is(tmp_path, kind, act):
    # transformers' Llama and Doge read hidden_act in their MLP (and Doge's CDMoE, in its experts too); the import
    # honours it, and the export wrote "silu" whatever the model's was (a GELU CDMoE 4e-2 away, without a word).
    from recipes.hf import export

    hf = build(kind, hidden_act=act)
    hf.save_pretrained(tmp_path / "hf")
    zoo = from_pretrained(tmp_path / "hf").eval()
    export(zoo, tmp_path / "exported")
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["hidden_act"] == act
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    theirs.config._attn_implementation = "eager"
    ids = torch.randint(0, VOCAB, (1, T))
    with torch.no_grad():
        logits = decode_one_token_at_a_time(theirs, ids) if kind == "doge-moe" else theirs(ids).logits
        assert relative_error(zoo(ids), logits) <= 1e-5


def test_a_byte_tokenizer_for_a_larger_vocabulary_names_the_unused_ids_and_mqar_has_none_to_export(tmp_path, capsys):
    from components import HybridLM
    from recipes.data.mqar import MQAR
    from recipes.data.text import TextCorpus
    from recipes.hf import export
    from recipes.hf.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer(260)
    assert tokenizer.get_vocab_size() == 260 and tokenizer.id_to_token(259) == "<|unused_259|>"
    assert tokenizer.encode("é€", add_special_tokens=False).ids == list("é€".encode())
    model = HybridLM(260, 16, "AM", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}})
    export(model, tmp_path / "bytes", data=TextCorpus())
    assert "tokenizer: bytes" in capsys.readouterr().out
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "bytes").convert_ids_to_tokens(257) == "<|unused_257|>"
    with pytest.raises(ValueError, match=r"data module MQAR has no tokenizer to export \(MQAR is not text\)"):
        export(model, tmp_path / "mqar", data=MQAR(vocab_size=260, seq_len=16, num_pairs=4))


def test_export_brings_a_corpus_tokenizer_that_encodes_as_the_data_module(tmp_path):
    from recipes.corpora import write_sample
    from recipes.data import TokenizedCorpus
    from recipes.hf import export

    write_sample(tmp_path / "sample", documents=40, vocab_size=300)
    data = TokenizedCorpus(str(tmp_path / "sample" / "english.jsonl"), tokenizer=str(tmp_path / "sample" / "tokenizer.json"),
                           cache_dir=str(tmp_path / "cache"), seq_len=8)
    from components import HybridLM

    model = HybridLM(data.vocab_size, 32, "AM×2", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 4}}})
    export(model, tmp_path / "exported", data=data)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
    text = "The with statement is used to wrap the execution of a block."
    assert tokenizer(text)["input_ids"] == data.encode(text)
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert config["eos_token_id"] == data.end_of_document == tokenizer.eos_token_id


@pytest.mark.parametrize("recipe, reason", [
    ("arch/tiny/otce.yaml", "no Hugging Face class"),
    ("arch/tiny/jamba.yaml", "no Hugging Face class"),
    ("arch/tiny/cheems.yaml", "no Hugging Face class"),
    ("arch/tiny/transxssm.yaml", "no Hugging Face class"),
])
def test_export_refuses_what_transformers_cannot_express_by_name(tmp_path, recipe, reason):
    import yaml

    from recipes.recipe_files import CONFIG_DIR
    from recipes.hf import export
    from recipes.module import LanguageModel

    model = yaml.safe_load((CONFIG_DIR / recipe).read_text())["model"]
    lm = LanguageModel(**{k: v for k, v in model.items() if k in ("d_model", "pattern", "mixers", "size_to", "residual_scale",
                                                                   "tie_embeddings")})
    with pytest.raises(ValueError, match=reason) as info:
        export(lm, tmp_path / "out")
    assert "as " in str(info.value) and "Exportable: LlamaForCausalLM" in str(info.value)
    assert not (tmp_path / "out" / "config.json").exists()


def test_export_names_what_keeps_a_model_from_each_hugging_face_class():
    """Each adapter's ``mismatch``: None for a model its class computes, else the first difference, by name."""
    from components import HybridLM
    from recipes.hf.architectures import Llama, Mamba2

    def model(pattern="AM×2", a=None, m=None, s=None, **kwargs):
        mixers = {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, **(a or {})}},
                  "M": {"class_path": "components.MLP", "init_args": m or {}},
                  "S": {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "conv": True,
                                                                       "rope": False, "gate": True, **(s or {})}},
                  "I": {"class_path": "components.InnerFuncAttention", "init_args": {"n_heads": 2}}}
        letters = set(pattern.replace("×2", ""))
        return HybridLM(32, 16, pattern, {k: v for k, v in mixers.items() if k in letters}, **kwargs)

    assert Llama.mismatch(model()) is None and Mamba2.mismatch(model("S-×2")) is None
    cases = [(Llama, model("AMSM"), "its pattern has blocks ['AM', 'SM']; a LlamaForCausalLM is QCAttention"),
             (Llama, model(a={"qk_norm": True}), "its attention has no RoPE or has a QK-norm"),
             (Llama, model(a={"rope": False}), "its attention has no RoPE or has a QK-norm"),
             (Llama, model(m={"activation": "gelu"}), "its MLP is gelu with silu; Llama's is SwiGLU"),
             (Llama, model(residual_scale=True), "its blocks scale their residuals, which Llama does not"),
             (Mamba2, model("S-SM"), "its pattern has blocks ['S-', 'SM']"),
             (Mamba2, model("S-×2", s={"conv": False, "d_skip": True}),
              "its SSD has conv=False, rope=False, gate=True, D=True"),
             (Mamba2, model("S-×2", s={"d_skip": False}), "its SSD has conv=True, rope=False, gate=True, D=False"),
             (Mamba2, model("S-×2", s={"rope": True}), "its SSD has conv=True, rope=True"),
             (Mamba2, model("S-×2", s={"gate": False}), "gate=False"),
             (Mamba2, model("S-×2", residual_scale=True), "its blocks scale their residuals, which Mamba-2 does not"),
             # Hugging Face's gate norm reads layer_norm_epsilon: an export would have changed this one without a word
             (Mamba2, model("S-×2", s={"norm_eps": 1e-5}), "its SSD's gate norm has eps 1e-05 and its other norms 1e-06; "
                                                          "a Mamba2ForCausalLM has one layer_norm_epsilon")]
    for adapter, built, reason in cases:
        assert reason in (adapter.mismatch(built) or ""), (adapter.name, reason)
    letters = HybridLM(32, 16, "AM", {"A": {"class_path": "components.InnerFuncAttention", "init_args": {"n_heads": 2}},
                                      "M": {"class_path": "components.MLP"}})
    assert Llama.mismatch(letters).startswith("its 'A'/'M' letters are InnerFuncAttention/MLP")
    not_ssd = HybridLM(32, 16, "S-", {"S": {"class_path": "components.InnerFuncAttention", "init_args": {"n_heads": 2}}})
    assert Mamba2.mismatch(not_ssd).startswith("its 'S' letter is InnerFuncAttention")
    stretched = Llama.config(model(extrapolate=True, rope_ntk_factor=2.0, max_seq_len=64))
    assert stretched["rope_scaling"] == {"rope_type": "dynamic", "factor": 2.0}
    assert stretched["max_position_embeddings"] == 64
    assert "rope_scaling" not in Llama.config(model())
    # export's refusal names the class the model comes closest to: one whose difference is not the pattern
    from recipes.hf import hf_architecture

    # (a QK-norm of the model's eps is Qwen3's; one of its own eps no class's)
    with pytest.raises(ValueError, match=r"this model \(pattern 'AM×2'\) has no Hugging Face class: as "
                                         r"LlamaForCausalLM, its attention has no RoPE or has a QK-norm"):
        hf_architecture(model(a={"qk_norm": True, "norm_eps": 1e-5}))


def test_a_weight_with_no_place_on_either_side_is_refused_by_name():
    from recipes.hf.architectures import to_hf, to_zoo

    hf = build("llama")
    config = {**hf.config.to_dict(), "architectures": ["LlamaForCausalLM"]}
    state = hf.state_dict()
    zoo = to_zoo(config, {**state, "model.rotary_emb.inv_freq": torch.ones(4)})  # (a buffer HF recomputes)
    assert to_hf(config, zoo).keys() == state.keys()
    assert torch.equal(zoo["lm_head.weight"], state["lm_head.weight"])  # untied: its own head
    # a tied model's file has no head: the embedding is the head, whether or not the config says tie_word_embeddings
    untold = {k: v for k, v in config.items() if k != "tie_word_embeddings"}
    headless = to_zoo(untold, {k: v for k, v in state.items() if k != "lm_head.weight"})
    assert headless["lm_head.weight"] is headless["embedding.weight"]
    with pytest.raises(ValueError, match=r"the folder's weights lack 'model.norm.weight', which a LlamaForCausalLM of "
                                         r"its config has"):
        to_zoo(config, {k: v for k, v in state.items() if k != "model.norm.weight"})
    mamba2 = build("mamba2")
    mamba2_config = {**mamba2.config.to_dict(), "architectures": ["Mamba2ForCausalLM"]}
    with pytest.raises(ValueError, match=r"lack 'backbone.layers.1.mixer.in_proj.weight', which a Mamba2ForCausalLM"):
        to_zoo(mamba2_config, {k: v for k, v in mamba2.state_dict().items()
                               if k != "backbone.layers.1.mixer.in_proj.weight"})
    with pytest.raises(ValueError,
                       match=r"weights the zoo has no place for: \['model.layers.0.self_attn.q_proj.bias'\]"):
        to_zoo(config, {**state, "model.layers.0.self_attn.q_proj.bias": torch.zeros(4)})
    with pytest.raises(ValueError,
                       match=r"zoo weights Hugging Face's LlamaForCausalLM has no place for: \['blocks.0.x'\]"):
        to_hf(config, {**zoo, "blocks.0.x": torch.zeros(1)})


def test_doges_mismatches_and_the_config_values_an_import_refuses_by_name():
    import copy

    from components import HybridLM
    from recipes.hf.architectures import EVERY_KEY, Doge, Llama, Mamba2

    c = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
         "intermediate_size": 32, "num_hidden_layers": 2, "vocab_size": 32, "max_position_embeddings": 64,
         "keep_window_size": 8}
    dense, moe = Doge.recipe(c), Doge.recipe({**c, "is_moe": True, "num_experts": 16, "num_experts_per_tok": 2})
    assert Doge.mismatch(HybridLM(**dense)) is None and Doge.mismatch(HybridLM(**moe)) is None
    assert Doge.config(HybridLM(**dense))["keep_window_size"] == 8
    unwindowed = copy.deepcopy(dense)
    unwindowed["mixers"]["I"]["init_args"]["keep_window"] = None  # every key kept: a window of the whole length
    assert Doge.config(HybridLM(**unwindowed))["keep_window_size"] == 64
    # ... and of any length where the model extrapolates (a window of 64 cut its longer sequences in transformers)
    endless = Doge.config(HybridLM(**{**unwindowed, "extrapolate": True}))["keep_window_size"]
    assert endless == EVERY_KEY and Doge.recipe({**c, "keep_window_size": endless})["mixers"]["I"]["init_args"]["keep_window"] is None

    def changed(recipe, letter=None, **settings):
        recipe = copy.deepcopy(recipe)
        if letter is None:
            recipe.update(settings)
        else:
            recipe["mixers"][letter]["init_args"].update(settings)
        return Doge.mismatch(HybridLM(**recipe)) or ""

    assert changed(dense, pattern="IM×1") == ""  # (one block is still Doge)
    assert "its pattern has blocks ['IE', 'IM']" in changed({**moe, "mixers": {**moe["mixers"], **dense["mixers"]}},
                                                           pattern="IMIE")
    assert "its InnerFuncAttention is inner='linear', mask='content'" in changed(dense, "I", mask="content")
    assert "its InnerFuncAttention is inner='retrieval'" in changed(dense, "I", inner="retrieval")
    assert "its InnerFuncAttention is" in changed(dense, "I", qk_norm=False)
    assert "its InnerFuncAttention is" in changed(dense, "I", rope=False)
    # Hugging Face's QK-norm reads rms_norm_eps: an export would have changed this one without a word
    assert ("its attention's QK-norm has eps 1e-05 and its other norms 1e-06; a DogeForCausalLM has one rms_norm_eps"
            in changed(dense, "I", norm_eps=1e-5))
    assert changed(dense, residual_scale=False) == "its blocks do not scale their residuals, which Doge does"
    assert "its MLP is gelu with silu; Doge's is SwiGLU" in changed(dense, "M", activation="gelu")
    assert changed(dense, "M", act="gelu") == ""  # (exported as hidden_act: gelu)
    assert "its MLP is gelu with silu" in changed(dense, "M", activation="gelu")
    for settings in ({"n_heads": 2}, {"cross_domain": "sequential"}, {"key_dim": 8}):
        assert "its CDMoE is not Doge's" in changed(moe, "E", **settings), settings
    routed = {**dense, "mixers": {**dense["mixers"], "M": {"class_path": "components.RoutedMoE",
                                                           "init_args": {"n_experts": 4, "top_k": 1}}}}
    assert "its state mixer is RoutedMoE" in changed(routed)
    qc = {**dense, "mixers": {**dense["mixers"],
                              "I": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}}}
    assert "its 'I' letter is QCAttention" in changed(qc)

    # InnerFuncAttention's heads are the width over the heads; QCAttention's need not be
    with pytest.raises(ValueError, match=r"head_dim=4 · heads=2 != hidden_size=16: not supported"):
        Doge.recipe({**c, "head_dim": 4})
    assert Llama.recipe({**c, "head_dim": 4, "hidden_act": "silu"})["mixers"]["A"]["init_args"]["head_dim"] == 4
    with pytest.raises(ValueError, match=r"num_experts=12 is not a square: Doge's CDMoE uses only the first"):
        Doge.recipe({**c, "is_moe": True, "num_experts": 12, "num_experts_per_tok": 2})
    mamba = {"hidden_size": 16, "expand": 2, "num_heads": 4, "head_dim": 8, "state_size": 8, "n_groups": 1,
             "layer_norm_epsilon": 1e-5, "num_hidden_layers": 2, "vocab_size": 32}
    recipe = Mamba2.recipe(mamba)
    assert recipe["pattern"] == "S-×2" and recipe["extrapolate"] and recipe["padding_idx"] is None  # no length limit
    with pytest.raises(ValueError, match=r"num_heads·head_dim = 24 != expand·hidden_size = 32"):
        Mamba2.recipe({**mamba, "num_heads": 3})
    with pytest.raises(ValueError, match=r"time_step_limit=\[0.0, 1.0\] is not supported \(the zoo does not clamp"):
        Mamba2.recipe({**mamba, "time_step_limit": [0.0, 1.0]})


def test_rope_settings_of_either_config_form_and_the_embeddings_padding_row():
    from recipes.hf.architectures import common_recipe, rope_settings

    assert rope_settings({}) == (10000.0, 1.0, False)
    assert rope_settings({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}) == (5e5, 1.0, False)
    assert rope_settings({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4}}) == \
        (1e4, 4.0, True)  # transformers 5.x
    assert rope_settings({"rope_theta": 2e4, "rope_scaling": {"type": "dynamic", "factor": 2}}) == (2e4, 2.0, True)
    for kind in ("linear", "yarn", "llama3"):
        with pytest.raises(ValueError, match=rf"RoPE type '{kind}' is not supported \(default and dynamic NTK are\)"):
            rope_settings({"rope_parameters": {"rope_type": kind, "rope_theta": 1e4, "factor": 2}})
    config = {"hidden_size": 8, "vocab_size": 10}
    padding = {pad: common_recipe({**config, "pad_token_id": pad}, 1e4, 1.0, False)["padding_idx"]
               for pad in (0, 9, 10, -1, None)}
    assert padding == {0: 0, 9: 9, 10: None, -1: None, None: None}  # a row of the embedding, or none
    assert common_recipe({**config, "pad_token_id": 3}, 1e4, 1.0, False, padding=False)["padding_idx"] is None


def test_every_field_the_importer_pins_passes_at_its_own_values_and_is_refused_at_another():
    from recipes.hf.architectures import MUST_BE, audit

    other = {"attention_bias": True, "mlp_bias": True, "attention_dropout": 0.1, "hidden_dropout": 0.1,
             "pretraining_tp": 2, "sliding_window": 8, "use_bias": True, "use_conv_bias": False, "norm_topk_prob": True,
             "rms_norm": False, "norm_before_gate": True, "hidden_act": "gelu", "mlp_type": "moe",
             "router_jitter_noise": 0.1}
    assert set(other) == set(MUST_BE)  # (a field pinned later gets its case here)
    positions = {"max_position_embeddings"}  # (an adapter's own field)
    for key, values in MUST_BE.items():
        for value in values:
            audit({key: value, "max_position_embeddings": 64}, positions, "m")
        with pytest.raises(ValueError, match=re.escape(f"m: fields the zoo would not honour: {key}={other[key]!r} "
                                                       f"(the zoo computes only {values[0]!r})")):
            audit({key: other[key], "max_position_embeddings": 64}, positions, "m")
        audit({key: other[key]}, {key}, "m")  # honoured by the adapter: its own to map
    audit({"sliding_window": 64, "max_position_embeddings": 64}, positions, "m")  # a window over every position: none
    with pytest.raises(ValueError, match=r"sliding_window=63"):
        audit({"sliding_window": 63, "max_position_embeddings": 64}, positions, "m")
    audit({"transformers_version": "9.9", "new_flag": False, "new_list": []}, set(), "m")  # bookkeeping, falsy
    with pytest.raises(ValueError, match=r"new_flag=True \(unknown to the importer\); new_size=3 \(unknown"):
        audit({"new_flag": True, "new_size": 3}, set(), "m")


@pytest.mark.parametrize("field, value, message", [
    ("sliding_window", 8, "sliding_window=8 (the zoo computes only None)"),
    ("attention_dropout", 0.1, "attention_dropout=0.1"),
    ("some_new_switch", True, "some_new_switch=True (unknown to the importer)"),
])
def test_a_config_field_that_would_change_the_computation_is_refused_by_name(tmp_path, field, value, message):
    kind = "doge" if field == "sliding_window" else "llama"
    build(kind).save_pretrained(tmp_path / kind)
    path = tmp_path / kind / "config.json"
    config = json.loads(path.read_text())
    config[field] = value
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=re.escape(message)):
        from_pretrained(tmp_path / kind)


def test_dynamic_ntk_runs_past_its_positions_mamba2_has_no_limit_and_padding_rows_do_not_learn(tmp_path):
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, intermediate_size=48,
                                      num_attention_heads=4, max_position_embeddings=16, pad_token_id=3,
                                      rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "ntk")
    zoo = from_pretrained(tmp_path / "ntk").eval()
    ids = torch.randint(0, VOCAB, (1, 40))  # past max_position_embeddings = 16
    with torch.no_grad():
        assert relative_error(zoo(ids), hf(ids).logits) <= 1e-5
    assert zoo.embedding.padding_idx == 3
    zoo.train()
    ids[0, :4] = torch.tensor([3, 5, 3, 5])
    zoo(ids).sum().backward()
    assert zoo.embedding.weight.grad[3].abs().max() == 0 and zoo.embedding.weight.grad[5].abs().max() > 0
    _, mamba = saved(tmp_path, "mamba2")
    assert mamba.extrapolate and mamba(torch.randint(0, VOCAB, (1, 3000))).shape == (1, 3000, VOCAB)


def test_bf16_and_sharded_folders_import(tmp_path):
    hf = build("llama")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ids = torch.randint(0, VOCAB, (2, T))
    with torch.no_grad():
        assert relative_error(from_pretrained(tmp_path / "sharded").eval()(ids), hf(ids).logits) <= 1e-5
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    zoo = from_pretrained(tmp_path / "bf16").eval()
    assert zoo.embedding.weight.dtype == torch.bfloat16
    for (name, theirs), ours in zip(hf.state_dict().items(), [zoo.embedding.weight]):
        assert torch.equal(ours, hf.model.embed_tokens.weight)
    with torch.no_grad():
        assert relative_error(zoo(ids).float(), hf(ids).logits.float()) <= 2e-2  # both in bf16


def test_unsupported_folders_are_named(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ValueError, match="architecture 'GPT2LMHeadModel' is not supported"):
        from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_pretrained(tmp_path / "missing")
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')  # hand-written: no architectures (it said None)
    with pytest.raises(ValueError, match="no architectures entry, model_type 'gpt2' is not supported"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('["LlamaForCausalLM"]')
    with pytest.raises(ValueError, match="config.json holds a list, not a configuration object"):
        from_pretrained(tmp_path)


def moe_blocks(kind: str):
    """transformers' Mixtral block or DeepSeek-V2 MoE (weights N(0, 0.3)) and the zoo's MoE of its weights."""
    from components import RoutedMoE, SharedExpertMoE

    torch.manual_seed(0)
    if kind == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        theirs = MixtralSparseMoeBlock(transformers.MixtralConfig(hidden_size=16, intermediate_size=12,
                                                                  num_local_experts=5, num_experts_per_tok=2))
        ours = RoutedMoE(16, n_experts=5, top_k=2, d_ff=12, normalize=True)
    else:
        # DeepSeekMoE's shared-expert isolation as transformers has it: a softmax over every expert, its top-k taken
        # as the gates without renormalising, the shared experts one MLP n_shared times as wide, added on every token.
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe

        theirs = DeepseekV2Moe(transformers.DeepseekV2Config(
            hidden_size=16, moe_intermediate_size=12, n_routed_experts=5, num_experts_per_tok=2, n_shared_experts=2,
            routed_scaling_factor=1.0, topk_method="greedy", num_attention_heads=2, num_key_value_heads=2))
        ours = SharedExpertMoE(16, n_experts=5, top_k=2, n_shared=2, d_ff=12)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
        for name, tensor in moe_as_zoo(theirs, lambda p: p).items():
            ours.get_parameter(name).copy_(tensor)
    return theirs, ours


def moe_as_zoo(theirs, part) -> dict[str, torch.Tensor]:
    """``part`` (a parameter's value or its gradient) of each of a transformers MoE block's weights, by the zoo's names."""
    zoo = {"router.centroids.weight": part(theirs.gate.weight),
           "experts.w_in": part(theirs.experts.gate_up_proj).transpose(1, 2),  # [E, d, gate | up]
           "experts.w_out": part(theirs.experts.down_proj).transpose(1, 2)}  # [E, d_ff, d]
    shared = getattr(theirs, "shared_experts", None)
    if shared is not None:
        zoo["shared_expert.in_proj.weight"] = torch.cat([part(shared.gate_proj.weight), part(shared.up_proj.weight)])
        zoo["shared_expert.out_proj.weight"] = part(shared.down_proj.weight)
    return zoo


@pytest.mark.parametrize("kind", ["mixtral", "deepseek_v2"])
def test_the_routed_moes_equal_mixtrals_block_and_deepseek_v2s_moe_with_gradients(kind):
    """``RoutedMoE(normalize=True)`` is Mixtral's sparse block; ``SharedExpertMoE`` is DeepSeek-V2's MoE (greedy,
    scale 1): equal outputs on copied weights, and every gradient."""
    theirs, ours = moe_blocks(kind)
    x = torch.randn(2, 9, 16)
    want, got = theirs(x), ours(x)
    assert relative_error(got, want) <= 1e-5
    g = torch.randn_like(want)
    (want * g).sum().backward()
    (got * g).sum().backward()
    grads = moe_as_zoo(theirs, lambda p: p.grad)
    assert grads.keys() == dict(ours.named_parameters()).keys()
    for name, grad in grads.items():
        assert relative_error(ours.get_parameter(name).grad, grad) <= GRADIENT_TOLERANCE, name


def granite_as_zoo(hf: dict[str, torch.Tensor], moe: bool) -> dict[str, torch.Tensor]:
    """A GraniteMoeHybrid's tensors (weights or their gradients) by the names of the zoo's ``S? A? S? A?``."""
    zoo = {"embedding.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"],
           "lm_head.weight": hf["lm_head.weight"]}
    for i in range(4):
        h, b = f"model.layers.{i}", f"blocks.{i}"
        zoo[f"{b}.sequence_norm.weight"] = hf[f"{h}.input_layernorm.weight"]
        zoo[f"{b}.state_norm.weight"] = hf[f"{h}.post_attention_layernorm.weight"]
        s = f"{b}.sequence_mixer"
        if i % 2 == 0:  # Mamba-2: the zoo's in_proj rows are [xBC | dt | z], Hugging Face's [z | xBC | dt]
            m = f"{h}.mamba"
            for ours, theirs in (("conv.weight", "conv1d.weight"), ("conv.bias", "conv1d.bias"), ("dt_bias", "dt_bias"),
                                 ("A_log", "A_log"), ("D", "D"), ("gate_norm.weight", "norm.weight"),
                                 ("out_proj.weight", "out_proj.weight")):
                zoo[f"{s}.{ours}"] = hf[f"{m}.{theirs}"]
            z, xbc, dt = hf[f"{m}.in_proj.weight"].split([64, 64 + 2 * 2 * 16, 8])
            zoo[f"{s}.in_proj.weight"] = torch.cat([xbc, dt, z])
        else:
            a = f"{h}.self_attn"
            zoo[f"{s}.q_proj.weight"] = hf[f"{a}.q_proj.weight"]
            zoo[f"{s}.kv_proj.weight"] = torch.cat([hf[f"{a}.k_proj.weight"], hf[f"{a}.v_proj.weight"]])
            zoo[f"{s}.out_proj.weight"] = hf[f"{a}.o_proj.weight"]
        t = f"{b}.state_mixer"
        shared = f"{t}.shared_expert" if moe else t  # Granite's shared MLP: [gate | up] rows, as the zoo's MLP
        zoo[f"{shared}.in_proj.weight"] = hf[f"{h}.shared_mlp.input_linear.weight"]
        zoo[f"{shared}.out_proj.weight"] = hf[f"{h}.shared_mlp.output_linear.weight"]
        if moe:
            e = f"{h}.block_sparse_moe"
            zoo[f"{t}.router.centroids.weight"] = hf[f"{e}.router.weight"]
            zoo[f"{t}.experts.w_in"] = hf[f"{e}.experts.gate_up_proj"].transpose(1, 2)  # [E, d, gate | up]
            zoo[f"{t}.experts.w_out"] = hf[f"{e}.experts.down_proj"].transpose(1, 2)  # [E, d_ff, d]
    return zoo


def granite_and_zoo(moe: bool, rope: bool):
    """A tiny random GraniteMoeHybrid (Mamba-2, attention, Mamba-2, attention) and the zoo's model of its weights."""
    from components import HybridLM

    torch.manual_seed(0)
    config = transformers.GraniteMoeHybridConfig(
        vocab_size=64, hidden_size=32, intermediate_size=12, shared_intermediate_size=24, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4 if moe else 0, num_experts_per_tok=2,
        layer_types=["mamba", "attention", "mamba", "attention"], mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2,
        mamba_chunk_size=8, mamba_expand=2, position_embedding_type="rope" if rope else "nope",
        attention_multiplier=8 ** -0.5, max_position_embeddings=64, rms_norm_eps=1e-5)
    theirs = transformers.GraniteMoeHybridForCausalLM(config)
    theirs.config._attn_implementation = "eager"
    randomize(theirs)
    with torch.no_grad():  # weights of std 0.2, not 0.02: each mixer then moves the residual stream (and a bug shows)
        for p in theirs.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    state = "E" if moe else "M"
    mixers = {"S": {"class_path": "components.SSD", "init_args": {"n_heads": 8, "d_state": 16, "n_groups": 2, "expand": 2,
                                                                  "chunk_size": 8, "conv": True, "rope": False, "gate": True,
                                                                  "norm_eps": 1e-5}},
              "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 4, "n_kv_heads": 2, "rope": rope}},
              state: ({"class_path": "components.SharedExpertMoE",
                       "init_args": {"n_experts": 4, "top_k": 2, "n_shared": 2, "d_ff": 12, "normalize": True}} if moe
                      else {"class_path": "components.MLP", "init_args": {"d_ff": 24}})}
    ours = HybridLM(64, 32, f"S{state} A{state} S{state} A{state}", mixers, max_seq_len=64, norm_eps=1e-5)
    weights = granite_as_zoo(dict(theirs.named_parameters()), moe)
    ours.load_state_dict({name: tensor.detach().clone() for name, tensor in weights.items()})
    return theirs.eval(), ours.eval()


@pytest.mark.parametrize("moe, rope", [(False, True), (True, False)])  # (Granite 4.0 itself: no RoPE)
def test_a_hybrid_of_ssd_and_attention_equals_granite_4s_hybrid_with_gradients(moe, rope):
    """An independent check of the hybrid itself: transformers' GraniteMoeHybrid (IBM's Granite 4.0) is Mamba-2 and
    attention layers in one stack, each with a SwiGLU MLP or a top-k MoE plus a shared MLP. With its multipliers at 1
    (the attention's at 1/√head_dim) it is the zoo's ``SM AM SM AM`` (``SE AE …`` with ``SharedExpertMoE``,
    normalised gates) on copied weights: logits, a left-padded batch, every gradient, and greedy decoding."""
    theirs, ours = granite_and_zoo(moe, rope)
    ids = torch.randint(0, 64, (2, T))
    assert relative_error(ours(ids), theirs(ids).logits) <= 1e-5
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :6] = 0
    want = theirs(ids, attention_mask=mask).logits
    got = ours(ids, padding_mask=mask == 0)
    valid = mask.bool()
    assert relative_error(got[valid], want[valid]) <= 1e-5
    target = torch.randn_like(want)
    (want[valid] * target[valid]).sum().backward()
    (got[valid] * target[valid]).sum().backward()
    theirs_grads = granite_as_zoo({name: p.grad for name, p in theirs.named_parameters()}, moe)
    ours_params = dict(ours.named_parameters())
    assert theirs_grads.keys() == ours_params.keys()
    for name, grad in theirs_grads.items():
        assert relative_error(ours_params[name].grad, grad) <= GRADIENT_TOLERANCE, name
    # Decoding the hybrid (SSD states and key/value caches side by side), one token at a time: the logits equal
    # transformers' with its hybrid cache, and greedy ids of a left-padded batch its generate's.
    decodes_as_transformers(ours, theirs, ids, mask)


@pytest.mark.parametrize("moe, rope", [(False, True), (True, False)])
def test_a_granite_hybrid_imports_and_exports_both_ways(tmp_path, moe, rope):
    """``GraniteMoeHybridForCausalLM`` is the fourth adapter: a saved Granite hybrid imports equal to transformers'
    (its MoE weights under the names its files use), exports back to a folder transformers loads with equal logits,
    and imports again bit for bit."""
    from recipes.hf import export, hf_recipe

    theirs, _ = granite_and_zoo(moe, rope)
    theirs.save_pretrained(tmp_path / "granite")
    recipe = hf_recipe(tmp_path / "granite")
    assert recipe["pattern"] == ("SE AE SE AE" if moe else "SM AM SM AM")
    assert recipe["extrapolate"] is not rope  # (no positions anywhere without RoPE: any length)
    zoo = from_pretrained(tmp_path / "granite").eval()
    ids = torch.randint(0, 64, (2, T))
    with torch.no_grad():
        assert relative_error(zoo(ids), theirs(ids).logits) <= 1e-5
    export(zoo, tmp_path / "exported")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    again.config._attn_implementation = "eager"
    with torch.no_grad():
        assert relative_error(zoo(ids), again(ids).logits) <= 1e-5
    for (name, a), b in zip(zoo.state_dict().items(), from_pretrained(tmp_path / "exported").state_dict().values()):
        assert torch.equal(a, b), name


def test_what_keeps_a_model_from_granite_and_the_granite_fields_an_import_refuses_are_named(tmp_path):
    from components import HybridLM
    from recipes.hf import export, hf_architecture
    from recipes.hf.architectures import GraniteHybrid

    ssd = {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "conv": True, "rope": False,
                                                          "gate": True}}
    attention = {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "rope": False}}
    mlp = {"class_path": "components.MLP", "init_args": {"d_ff": 24}}
    moe = {"class_path": "components.SharedExpertMoE", "init_args": {"n_experts": 4, "top_k": 2, "d_ff": 8,
                                                                     "normalize": True}}

    def model(pattern="SM SM AM", **mixers):
        letters = set(pattern) - {" ", "-"}
        bound = {"S": ssd, "A": attention, "M": mlp, "E": moe, **mixers}
        return HybridLM(32, 16, pattern, {k: v for k, v in bound.items() if k in letters})

    def changed(spec, **init_args):
        return {"class_path": spec["class_path"], "init_args": {**spec["init_args"], **init_args}}

    assert GraniteHybrid.mismatch(model()) is None and GraniteHybrid.mismatch(model("SE AE SE")) is None
    assert hf_architecture(model("SM AM")) is GraniteHybrid and hf_architecture(model("AE AE")) is GraniteHybrid
    # transformers' Granite fails without an attention layer (its cache asks one for the mask sizes), so a model of
    # SSD blocks with MLPs (not Mamba-2's "S-") has no class
    with pytest.raises(ValueError, match=r"as GraniteMoeHybridForCausalLM, it has no attention block, and transformers"):
        hf_architecture(model("SM×2"))
    attention_moe = model("AE AE").eval()  # no SSD: the config's Mamba-2 fields are placeholders, and valid
    export(attention_moe, tmp_path / "ae")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ae").eval()
    ids = torch.randint(0, 32, (1, 7))
    with torch.no_grad():
        assert relative_error(attention_moe(ids), theirs(ids).logits) <= 1e-5
    cases = [(model("SM S- AM"), "its pattern has blocks ['AM', 'S-', 'SM']"),
             (model("SM AE"), "its state mixers are ['MLP', 'SharedExpertMoE']"),
             (model(S=changed(ssd, rope=True)), "its SSDs are not all Mamba-2's"),
             (model(S=changed(ssd, norm_eps=1e-5)), "its SSDs' gate norms have another eps"),
             (model("SM TM AM", T=changed(ssd, d_state=16)), "its SSDs differ"),
             (model(A=changed(attention, qk_norm=True)), "its attention has a QK-norm"),
             (model("SM AM BM", B=changed(attention, rope=True)), "its attentions differ"),
             (model(M=changed(mlp, activation="gelu")), "its MLPs are not all one SwiGLU MLP"),
             (model("SE AE", E=changed(moe, normalize=False)), "its MoE is not Granite's"),
             (model("SE AE", E={"class_path": "components.RoutedMoE", "init_args": {"n_experts": 4, "normalize": True}}),
              "its MoE is not Granite's"),
             (HybridLM(32, 16, "SM AM", {"S": ssd, "A": attention, "M": mlp}, residual_scale=True),
              "its blocks scale their residuals")]
    for built, reason in cases:
        assert reason in (GraniteHybrid.mismatch(built) or ""), reason
    written = GraniteHybrid.config(model("SE AE SE"))
    assert written["layer_types"] == ["mamba", "attention", "mamba"] and written["num_local_experts"] == 4
    assert written["position_embedding_type"] == "nope" and written["attention_multiplier"] == 8 ** -0.5

    c = {"architectures": [GraniteHybrid.name], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 8, "shared_intermediate_size": 24,
         "rms_norm_eps": 1e-6, "layer_types": ["mamba", "attention"], "mamba_n_heads": 4, "mamba_d_head": 8,
         "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_expand": 2, "attention_multiplier": 8 ** -0.5,
         "num_experts_per_tok": 2}
    assert hf_recipe(c)["pattern"] == "SM AM" and hf_recipe({**c, "num_local_experts": 4})["pattern"] == "SE AE"
    # a Granite of attention layers alone needs no Mamba-2 sizes (the import asked for mamba_d_state)
    attention_only = {k: v for k, v in c.items() if not k.startswith("mamba_")}
    assert hf_recipe({**attention_only, "layer_types": ["attention"] * 2})["mixers"].keys() == {"A", "M"}
    # ... nor one of Mamba-2 layers alone attention sizes (which it does not use, and which need not fit)
    assert hf_recipe({**c, "layer_types": ["mamba"] * 2, "num_attention_heads": 3})["pattern"] == "SM SM"
    for field, value, message in [("embedding_multiplier", 12.0, "embedding_multiplier=12.0 (the zoo computes only 1)"),
                                  ("residual_multiplier", 0.22, "residual_multiplier=0.22"),
                                  ("logits_scaling", 8.0, "logits_scaling=8.0"),
                                  ("attention_multiplier", 0.0078125, "attention_multiplier=0.0078125 (the zoo scales "
                                                                      "the scores by 1/√head_dim = 0.353553)"),
                                  ("mamba_proj_bias", True, "mamba_proj_bias=True"),
                                  ("time_step_limit", [0.0, 1.0], "time_step_limit=[0.0, 1.0]"),
                                  ("position_embedding_type", "alibi", "position_embedding_type='alibi'"),
                                  ("shared_intermediate_size", 20, "shared_intermediate_size=20 (the zoo's shared expert "
                                                                   "is a positive multiple of intermediate_size=8)")]:
        settings = {**c, field: value, **({"num_local_experts": 4} if field == "shared_intermediate_size" else {})}
        with pytest.raises(ValueError, match=re.escape(message)):
            hf_recipe(settings)
    with pytest.raises(ValueError, match=r"layer_types=\['mamba', 'moe'\]: num_hidden_layers=2 of mamba, "):
        hf_recipe({**c, "layer_types": ["mamba", "moe"]})
    with pytest.raises(ValueError, match=r"mamba_n_heads·mamba_d_head = 24 != mamba_expand·hidden_size = 32"):
        hf_recipe({**c, "mamba_n_heads": 3})


def bamba(tmp_path, **settings):
    """A tiny random Bamba (Mamba-2, attention, Mamba-2, attention), saved: transformers' model and its folder."""
    torch.manual_seed(0)
    config = transformers.BambaConfig(**{
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "attn_layer_indices": [1, 3], "mamba_n_heads": 8, "mamba_d_head": 8,
        "mamba_d_state": 16, "mamba_n_groups": 2, "mamba_chunk_size": 8, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, **settings})
    return saved_random(transformers.BambaForCausalLM, config, tmp_path / "bamba"), tmp_path / "bamba"


def saved_random(model_class, config, folder, prepare=lambda model: None):
    """transformers' ``model_class`` of ``config``, eager, its matrices drawn with std 0.2 (each mixer and expert then
    moves the residual stream, and a swapped one shows), then ``prepare``'d, saved to ``folder``; in eval mode."""
    theirs = model_class(config)
    theirs.config._attn_implementation = "eager"
    randomize(theirs)
    with torch.no_grad():
        for p in theirs.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
        prepare(theirs)
    theirs.save_pretrained(folder)
    return theirs.eval()


def imports_equal_to_transformers(theirs, folder, as_files=lambda tensors: tensors):
    """``folder``'s import equals ``theirs`` (transformers' model saved there): logits, a left-padded batch, every
    gradient, decoding one token at a time and greedy ids of the padded batch. Returns the imported model.
    ``as_files``: ``theirs``' gradients by its modules' names → by the names its files hold (where they differ)."""
    from recipes.hf import convert_weights, read_config

    ours = from_pretrained(folder).eval()
    ids, mask = left_padded_backward(ours, theirs)
    with torch.no_grad():
        assert relative_error(ours(ids), theirs(ids).logits) <= 1e-5
    theirs_grads = convert_weights(read_config(folder), as_files({name: p.grad for name, p in theirs.named_parameters()}))
    for name, p in ours.named_parameters():
        assert relative_error(p.grad, theirs_grads[name]) <= GRADIENT_TOLERANCE, name
    decodes_as_transformers(ours, theirs, ids, mask)
    return ours


def left_padded_backward(ours, theirs) -> tuple[torch.Tensor, torch.Tensor]:
    """``ours`` and ``theirs`` (transformers') on a random batch whose second row is left-padded by 6: equal logits at
    the real positions; then one random linear function of those logits backpropagated through both. Returns the
    batch's ids and mask (1 = a token)."""
    ids = torch.randint(0, theirs.config.vocab_size, (2, T))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :6] = 0
    want, got, valid = theirs(ids, attention_mask=mask).logits, ours(ids, padding_mask=mask == 0), mask.bool()
    assert relative_error(got[valid], want[valid]) <= 1e-5
    target = torch.randn_like(want)
    (want[valid] * target[valid]).sum().backward()
    (got[valid] * target[valid]).sum().backward()
    return ids, mask


def decodes_as_transformers(ours, theirs, ids: torch.Tensor, mask: torch.Tensor) -> None:
    """``ours`` decoding ``ids[:1]`` one token at a time equals ``theirs`` through its cache, and greedy ids of the
    first 9 tokens of ``ids`` left-padded by ``mask`` (1 = a token) equal its ``generate``'s."""
    with torch.no_grad():
        want = decode_one_token_at_a_time(theirs, ids[:1])
        cache = ours.new_cache(1, ids.shape[1])
        got = torch.stack([ours(ids[:1, t:t + 1], position_ids=torch.tensor([[t]]), cache=cache)[:, -1]
                           for t in range(ids.shape[1])], dim=1)
    assert relative_error(got, want) <= 1e-5
    prompts = ids[:, :9].masked_fill(mask[:, :9] == 0, 0)
    greedy = theirs.generate(prompts, attention_mask=mask[:, :9], max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert ours.generate(prompts, 8, padding_mask=mask[:, :9] == 0).tolist() == greedy.tolist()


def exports_to_transformers(ours, folder, as_class: str | None = None) -> str:
    """``ours`` exported to ``folder`` (as ``as_class``, where given) loads in transformers with equal logits and
    imports again bit for bit; the class it was written as."""
    from recipes.hf import export, read_config

    export(ours, folder, as_class=as_class)
    again = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    again.config._attn_implementation = "eager"
    ids = torch.randint(0, ours.vocab_size, (2, T))
    with torch.no_grad():
        assert relative_error(ours(ids), again(ids).logits) <= 1e-5
    for (name, a), b in zip(ours.state_dict().items(), from_pretrained(folder).state_dict().values()):
        assert torch.equal(a, b), name
    return read_config(folder)["architectures"][0]


@pytest.mark.parametrize("fraction", [None, 0.25, 1.0])  # (None: the config leaves it to transformers, which turns half)
def test_bamba_imports_equal_to_transformers_with_its_partial_rope_and_exports_back(tmp_path, fraction):
    """An independent check of partial RoPE (``rope_fraction``) in a hybrid: IBM's Bamba (Mamba-2 and attention
    layers with SwiGLU MLPs, RoPE on the first half of each head unless its ``rope_parameters`` say otherwise) imports
    equal to transformers' — logits, a left-padded batch, every gradient, decoding one token at a time and greedy ids —
    and exports back to a folder transformers loads with equal logits, then imports again bit for bit."""
    rope = {} if fraction is None else {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                                           "partial_rotary_factor": fraction}}
    theirs, folder = bamba(tmp_path, **rope)
    if fraction is None:  # a 4.x file: rope_theta alone, no partial_rotary_factor (transformers turns half)
        path = folder / "config.json"
        config = {k: v for k, v in json.loads(path.read_text()).items() if k != "rope_parameters"}
        path.write_text(json.dumps({**config, "rope_theta": 10000.0}))
    ours = imports_equal_to_transformers(theirs, folder)
    turned = {b.sequence_mixer.positions.rope_dim for b in ours.blocks if b.token == "AM"}
    assert turned == {8 * (fraction or 0.5)} and ours.pattern == "SM AM SM AM"
    # (a whole-head RoPE exports as Granite, which has no partial one)
    assert exports_to_transformers(ours, tmp_path / "exported") == ("BambaForCausalLM" if fraction != 1.0 else
                                                                     "GraniteMoeHybridForCausalLM")


@pytest.mark.parametrize("head_dim, tied", [(12, True), (None, False)])  # (None: the config's default, 128)
def test_qwen3_imports_equal_to_transformers_with_its_qk_norm_and_wide_heads_and_exports_back(tmp_path, head_dim, tied):
    """Qwen3 is Llama with a per-head RMSNorm on Q and K before RoPE (the zoo's ``qk_norm``) and heads whose width is
    not the model's over the heads (``QCAttention(head_dim=…)``): 4 heads of 12 or of 128 channels in a width of 32."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-5, tie_word_embeddings=tied,
                                      **({"head_dim": head_dim} if head_dim else {}))
    theirs = transformers.Qwen3ForCausalLM(config)
    theirs.config._attn_implementation = "eager"
    randomize(theirs)
    theirs.save_pretrained(tmp_path / "qwen3")
    if head_dim is None:  # a config.json without head_dim: transformers reads Qwen3Config's default
        path = tmp_path / "qwen3" / "config.json"
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "head_dim"}))
    ours = imports_equal_to_transformers(theirs.eval(), tmp_path / "qwen3")
    attention = ours.blocks[0].sequence_mixer
    assert (attention.head_dim, attention.positions.q_norm.eps) == (head_dim or 128, 1e-5)
    assert exports_to_transformers(ours, tmp_path / "exported") == "Qwen3ForCausalLM"


def test_a_llama_with_heads_decoupled_from_its_width_imports_and_exports_and_what_the_hybrids_refuse(tmp_path):
    """Llama takes ``head_dim`` too (Mistral-Nemo's 128 over a width of 5,120 and 32 heads is this case); the hybrids'
    configs have no head_dim, so a hybrid with such heads is not exported as one, nor one whose attention keeps to a
    window."""
    from components import HybridLM
    from recipes.hf.architectures import Bamba, GraniteHybrid

    hf = build("llama", head_dim=12)
    hf.save_pretrained(tmp_path / "llama")
    ours = imports_equal_to_transformers(hf, tmp_path / "llama")
    assert ours.blocks[0].sequence_mixer.head_dim == 12
    assert exports_to_transformers(ours, tmp_path / "exported") == "LlamaForCausalLM"

    def hybrid(**attention):
        return HybridLM(32, 16, "SM AM", {"S": {"class_path": "components.SSD", "init_args": {
            "head_dim": 8, "d_state": 8, "conv": True, "rope": False, "gate": True}},
            "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, **attention}},
            "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}}})

    for adapter in (GraniteHybrid, Bamba):
        assert adapter.mismatch(hybrid()) is None
        assert "its attention's heads are not its width over the heads" in adapter.mismatch(hybrid(head_dim=12))
        assert re.fullmatch(r"its attention keeps to the last 7 keys; \w+'s attends to every key",
                            adapter.mismatch(hybrid(sliding_window=7)))


def qwen3_config(**settings) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 4,
            "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 8,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 64, **settings}


def test_qwen3s_windowed_layers_are_read_as_transformers_reads_them():
    """No window unless ``use_sliding_window`` (transformers drops ``sliding_window`` otherwise); then the layers
    ``layer_types`` names, or where it names none those from ``max_window_layers`` on; 4,096 keys where the config
    gives no ``sliding_window``. Windowed layers are a second letter ``W``, or the ``A`` itself where every layer is."""
    c = qwen3_config(sliding_window=16, use_sliding_window=False, max_window_layers=2)
    plain = {"n_heads": 2, "n_kv_heads": 2, "qk_norm": True, "norm_eps": 1e-6}  # (head_dim: the width's, not written)
    assert hf_recipe(c)["mixers"]["A"]["init_args"] == plain and hf_recipe(c)["pattern"] == "AM×4"
    recipe = hf_recipe({**c, "use_sliding_window": True})
    assert recipe["pattern"] == "AM AM WM WM" and recipe["mixers"]["A"]["init_args"] == plain
    assert recipe["mixers"]["W"]["init_args"] == {**plain, "sliding_window": 16}
    first = hf_recipe({**c, "use_sliding_window": True, "layer_types": ["sliding_attention"] + ["full_attention"] * 3})
    assert first["pattern"] == "WM AM AM AM"
    every = hf_recipe({k: v for k, v in c.items() if k != "sliding_window"} | {"use_sliding_window": True,
                                                                               "max_window_layers": 0})
    assert every["pattern"] == "AM×4" and every["mixers"]["A"]["init_args"]["sliding_window"] == 4096
    assert "W" not in every["mixers"]
    deep = hf_recipe({**qwen3_config(num_hidden_layers=30), "use_sliding_window": True})  # (Qwen3Config's 28)
    assert deep["pattern"] == " ".join(["AM"] * 28 + ["WM"] * 2)
    with pytest.raises(ValueError, match=r"layer_types=\['full_attention'\]: num_hidden_layers=4 of full_attention"):
        hf_recipe({**c, "layer_types": ["full_attention"]})
    with pytest.raises(ValueError, match=r"sliding_window=0: a window of at least one key expected"):
        hf_recipe({**c, "use_sliding_window": True, "sliding_window": 0})


def test_qwen3_with_windowed_layers_equals_transformers_and_exports_back(tmp_path):
    """A Qwen3 whose second and third layers attend to their last 5 keys (``layer_types``), over 19 tokens: equal to
    transformers' on logits, a left-padded batch (padding takes no place in the window), every gradient, decoding one
    token at a time past the window and greedy ids; it exports as a Qwen3 with those layer types."""
    from recipes.hf import read_config

    torch.manual_seed(0)
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    config = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=64, rms_norm_eps=1e-5, use_sliding_window=True,
                                      sliding_window=5, layer_types=types)
    theirs = transformers.Qwen3ForCausalLM(config)
    theirs.config._attn_implementation = "eager"
    randomize(theirs)
    theirs.save_pretrained(tmp_path / "qwen3")
    ours = imports_equal_to_transformers(theirs.eval(), tmp_path / "qwen3")
    assert ours.pattern == "AM WM WM AM"
    assert [b.sequence_mixer.sliding_window for b in ours.blocks] == [None, 5, 5, None]
    assert exports_to_transformers(ours, tmp_path / "exported") == "Qwen3ForCausalLM"
    written = read_config(tmp_path / "exported")
    assert (written["layer_types"], written["sliding_window"], written["use_sliding_window"]) == (types, 5, True)


@pytest.mark.parametrize("windowed", [False, True])
def test_qwen2_imports_equal_to_transformers_with_its_biases_and_exports_back(tmp_path, windowed):
    """Qwen2 (Qwen2.5's class): Llama's stack with biases on the query, key and value projections
    (``QCAttention(qkv_bias=True)``), and, where ``use_sliding_window``, Qwen3's windowed layers (here the middle two
    of four, a window of 5 over 19 tokens): equal to transformers' on logits, a left-padded batch, every gradient
    (the biases' too), decoding one token at a time and greedy ids; it exports as a Qwen2 with its layer types, and
    imports again bit for bit. The biases are drawn at random: transformers starts them at zero, where a bias mapped
    to the wrong place would hide."""
    from recipes.hf import read_config

    torch.manual_seed(0)
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    window = {"use_sliding_window": True, "sliding_window": 5, "layer_types": types} if windowed else {}
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-5, **window)
    theirs = transformers.Qwen2ForCausalLM(config)
    theirs.config._attn_implementation = "eager"
    randomize(theirs)
    theirs.save_pretrained(tmp_path / "qwen2")
    ours = imports_equal_to_transformers(theirs.eval(), tmp_path / "qwen2")
    assert ours.pattern == ("AM WM WM AM" if windowed else "AM×4")
    assert all(b.sequence_mixer.qkv_bias for b in ours.blocks)
    assert exports_to_transformers(ours, tmp_path / "exported") == "Qwen2ForCausalLM"
    written = read_config(tmp_path / "exported")
    assert "attention_bias" not in written
    assert (written["layer_types"], written["use_sliding_window"]) == (types if windowed else ["full_attention"] * 4,
                                                                       windowed)


def test_only_a_model_with_query_key_value_biases_is_a_qwen2_and_none_of_the_others():
    """The biases decide between Qwen2 and Llama's other heirs both ways: a Llama-like zoo model with them is refused
    as Llama, Mistral, Qwen3 and the hybrids by name, and one without them as Qwen2."""
    from components import HybridLM
    from recipes.hf.architectures import Bamba, GraniteHybrid, Llama, Mistral, Qwen2, Qwen3

    def llama(**attention):
        return HybridLM(32, 16, "AM×2", {"A": {"class_path": "components.QCAttention",
                                               "init_args": {"n_heads": 2, **attention}},
                                         "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}}})

    biased = llama(qkv_bias=True)
    assert Qwen2.mismatch(biased) is None and Qwen2.mismatch(llama()) == (
        "its attention has no bias on its query, key and value projections; Qwen2's has")
    for adapter in (Llama, Mistral):
        assert adapter.mismatch(biased) == ("its attention has biases on its query, key and value projections "
                                            f"(qkv_bias); {adapter.name.removesuffix('ForCausalLM')}'s has none")
    mixed = HybridLM(32, 16, "AM BM", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}},
                                       "B": {"class_path": "components.QCAttention",
                                             "init_args": {"n_heads": 2, "qkv_bias": True}},
                                       "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}}})
    assert Qwen2.mismatch(mixed) == "its blocks' attentions or MLPs differ in more than a window; Qwen2's layers are alike"
    assert "QK-norm" in Qwen3.mismatch(biased)  # (its first difference; with one, the biases)
    assert Qwen3.mismatch(llama(qkv_bias=True, qk_norm=True, norm_eps=1e-6)).startswith("its attention has biases")
    hybrid = HybridLM(32, 16, "SM AM", {
        "S": {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "expand": 2, "conv": True,
                                                           "rope": False, "gate": True, "norm_eps": 1e-6}},
        "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "qkv_bias": True}},
        "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}}})
    for adapter in (GraniteHybrid, Bamba):
        assert "(qkv_bias)" in adapter.mismatch(hybrid), adapter.name
    with pytest.raises(ValueError, match="QCAttention: qkv_bias='yes' must be True or False"):
        llama(qkv_bias="yes")


def test_a_mistral_imports_with_its_window_and_exports_as_mistral_or_as_llama_without_one(tmp_path):
    """Mistral is Llama's stack whose every layer attends to the last ``sliding_window`` keys (4,096 where the config
    has none, as transformers' default; null: every key). A window of 5 over 19 tokens, with Mistral-Nemo's kind of
    heads (12 channels in a width of 32 over 4 heads), equals transformers' Mistral and exports as one; without a
    window it exports as the Llama it computes."""
    from recipes.hf import read_config
    from recipes.hf.architectures import Llama, Mistral, Qwen3

    for window in (5, None):
        torch.manual_seed(0)
        config = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                            sliding_window=window, max_position_embeddings=64, rms_norm_eps=1e-5)
        theirs = transformers.MistralForCausalLM(config)
        theirs.config._attn_implementation = "eager"
        randomize(theirs)
        theirs.save_pretrained(tmp_path / f"mistral{window}")
        ours = imports_equal_to_transformers(theirs.eval(), tmp_path / f"mistral{window}")
        assert {b.sequence_mixer.sliding_window for b in ours.blocks} == {window}
        written = exports_to_transformers(ours, tmp_path / f"exported{window}")
        assert written == ("MistralForCausalLM" if window else "LlamaForCausalLM")
        assert read_config(tmp_path / f"exported{window}").get("sliding_window") == window
    assert Llama.mismatch(ours) is None and Mistral.mismatch(ours) is None  # (Llama is tried first)
    c = {k: v for k, v in config.to_dict().items() if k != "sliding_window"}
    c["architectures"] = ["MistralForCausalLM"]
    assert hf_recipe(c)["mixers"]["A"]["init_args"]["sliding_window"] == 4096  # (no window given: transformers')
    with pytest.raises(ValueError, match=r"sliding_window=0: a window of at least one key expected"):
        hf_recipe({**c, "sliding_window": 0})
    from components import HybridLM

    def decoder(pattern, windows, qk_norm=False):
        return HybridLM(32, 16, pattern, {
            **{letter: {"class_path": "components.QCAttention", "init_args": {
                "n_heads": 2, "qk_norm": qk_norm, "sliding_window": w}} for letter, w in windows.items()},
            "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}}})

    assert Llama.mismatch(decoder("AM×2", {"A": 7})) == "its attention keeps to the last 7 keys; Llama's attends to every key"
    assert Mistral.mismatch(decoder("AM×2", {"A": 7})) is None
    changed = decoder("AM×2", {"A": 7})
    changed.blocks[1].sequence_mixer.sliding_window = 3  # (one letter makes one window; a layer changed after)
    assert Mistral.mismatch(changed) == "its layers keep to different windows [3, 7]; Mistral's have one"
    mixed = decoder("AM WM", {"A": None, "W": 7})
    assert "its pattern has blocks ['AM', 'WM']" in Mistral.mismatch(mixed)
    assert Qwen3.mismatch(decoder("AM WM", {"A": None, "W": 7}, qk_norm=True)) is None
    assert Qwen3.mismatch(decoder("AM WM", {"A": 3, "W": 7}, qk_norm=True)) == (
        "its layers keep to different windows [3, 7]; Qwen3 has one sliding_window")
    unlike = HybridLM(32, 16, "AM WM", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "qk_norm": True}},
                                        "W": {"class_path": "components.QCAttention", "init_args": {"n_heads": 4, "qk_norm": True}},
                                        "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}}})
    assert Qwen3.mismatch(unlike) == "its blocks' attentions or MLPs differ in more than a window; Qwen3's layers are alike"
    wider = HybridLM(32, 16, "AM WN", {
        **{letter: {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "qk_norm": True,
                                                                          "sliding_window": w}}
           for letter, w in (("A", None), ("W", 7))},
        "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}},
        "N": {"class_path": "components.MLP", "init_args": {"d_ff": 16}}})  # (an MLP of its own under another letter)
    assert Qwen3.mismatch(wider) == "its blocks' attentions or MLPs differ in more than a window; Qwen3's layers are alike"


def test_a_bamba_with_dynamic_ntk_runs_past_its_positions_as_transformers_and_exports_it(tmp_path):
    """Dynamic NTK over a partial RoPE stretches the base by the turned channels (``dim/(dim−2)`` with dim the
    quarter or half of the head that turns), as transformers' does; the export writes it in ``rope_parameters``."""
    from recipes.hf import export, read_config

    rope = {"rope_type": "dynamic", "rope_theta": 500.0, "factor": 2.0, "partial_rotary_factor": 0.5}
    theirs, folder = bamba(tmp_path, max_position_embeddings=8, rope_parameters=rope)
    ours = from_pretrained(folder).eval()
    ids = torch.randint(0, 64, (1, T))  # (T = 19 > 8 positions)
    with torch.no_grad():
        want = theirs(ids).logits
        assert relative_error(ours(ids), want) <= 1e-5
        ours.rotary.scaling_factor = 1.0  # (the stretch matters here: without it the logits part)
        assert relative_error(ours(ids), want) > 1e-3
        ours.rotary.scaling_factor = 2.0
    export(ours, tmp_path / "exported")
    written = read_config(tmp_path / "exported")
    assert written["rope_parameters"] == rope and "rope_scaling" not in written and "rope_theta" not in written


def test_a_bamba_z_loss_joins_the_fine_tuning_recipe_as_transformers_adds_it_and_is_exported_back(tmp_path):
    """Bamba's ``z_loss_coefficient`` is a training setting: the import writes it as the recipe's ``model.z_loss``, and
    that model's training loss is transformers' (its cross-entropy plus the z-loss), but for the z-loss of the last
    position, which has no label: transformers averages it over every position, the zoo over the labelled ones."""
    from recipes import LanguageModel
    from recipes.hf import export, read_config, write_checkpoint
    from recipes.hf.tokenizer import END_OF_DOCUMENT, byte_tokenizer

    theirs, folder = bamba(tmp_path, vocab_size=257, z_loss_coefficient=0.01)
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens([END_OF_DOCUMENT])
    tokenizer.save(str(folder / "tokenizer.json"))
    checkpoint, recipe = write_checkpoint(folder, tmp_path / "out" / "bamba.ckpt")
    assert yaml.safe_load(recipe.read_text())["model"]["z_loss"] == 0.01
    lm = LanguageModel.load_from_checkpoint(checkpoint)
    ids = torch.randint(0, 257, (2, T))
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)  # the next token; none after the last
    out = theirs(ids, labels=ids)
    squares = out.logits.logsumexp(dim=-1).square()  # [2, T]
    want = out.loss - 0.01 * squares.mean() + 0.01 * squares[:, :-1].mean()
    assert relative_error(lm.training_loss({"input_ids": ids, "labels": labels}), want) <= 1e-5
    export(lm, tmp_path / "exported")
    assert read_config(tmp_path / "exported")["z_loss_coefficient"] == 0.01


def test_a_partial_rope_exports_only_as_bamba_and_the_bamba_fields_an_import_refuses_are_named(tmp_path):
    from components import HybridLM
    from recipes.hf import hf_architecture
    from recipes.hf.architectures import Bamba, Doge, GraniteHybrid, Llama

    ssd = {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "conv": True, "rope": False,
                                                          "gate": True}}
    attention = {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "rope_fraction": 0.5}}
    mlp = {"class_path": "components.MLP", "init_args": {"d_ff": 24}}

    def model(pattern="SM AM SM", **mixers):
        letters = set(pattern) - {" ", "-"}
        bound = {"S": ssd, "A": attention, "M": mlp, **mixers}
        return HybridLM(32, 16, pattern, {k: v for k, v in bound.items() if k in letters})

    def changed(spec, **init_args):
        return {"class_path": spec["class_path"], "init_args": {**spec["init_args"], **init_args}}

    assert hf_architecture(model()) is Bamba and hf_architecture(model("AM AM")) is Bamba
    whole = changed(attention, rope_fraction=1.0)
    assert hf_architecture(model(A=whole)) is GraniteHybrid and hf_architecture(model("AM AM", A=whole)) is Llama
    turns = "its attention turns 0.5 of each head by RoPE"
    assert f"{turns}; Llama's turns all of it" in Llama.mismatch(model("AM AM"))
    assert f"{turns}; Granite's turns all of it or none" in GraniteHybrid.mismatch(model())
    doge = HybridLM(32, 16, "IM IM", {"I": {"class_path": "components.InnerFuncAttention", "init_args": {
        "n_heads": 2, "mask": "content_exp", "qk_norm": True, "rope_fraction": 0.5}}, "M": mlp}, residual_scale=True)
    assert f"{turns}; Doge's turns all of it" in Doge.mismatch(doge)
    cases = [(model("SE AE", E={"class_path": "components.SharedExpertMoE", "init_args": {"n_experts": 4, "d_ff": 8}}),
              "its state mixers are not all one SwiGLU MLP"),
             (model(M=changed(mlp, activation="gelu")), "its state mixers are not all one SwiGLU MLP"),
             (model("SM AM BM", B=whole), "its attentions differ in heads or RoPE; Bamba has"),
             (model(A=changed(attention, rope=False)), "its attention has no RoPE, which Bamba's has"),
             (model("SM×2"), "it has no attention block, and transformers' Bamba fails without one")]
    for built, reason in cases:
        assert reason in (Bamba.mismatch(built) or ""), reason

    c = {"architectures": [Bamba.name], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 8, "rms_norm_eps": 1e-6,
         "attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_head": "auto", "mamba_d_state": 8, "mamba_n_groups": 1,
         "mamba_expand": 2, "rope_theta": 1e4}
    recipe = hf_recipe(c)  # 4.x's form: rope_theta alone, and transformers turns half of each head
    assert recipe["pattern"] == "SM AM" and recipe["mixers"]["A"]["init_args"]["rope_fraction"] == 0.5
    assert recipe["mixers"]["S"]["init_args"]["n_heads"] == 4  # (mamba_d_head "auto": expand·hidden / heads = 8)
    assert not recipe["extrapolate"]  # (RoPE: the model's length; Mamba-2 alone: any)
    assert hf_recipe({**c, "attn_layer_indices": None})["pattern"] == "SM SM"
    assert hf_recipe({**c, "attn_layer_indices": None})["extrapolate"]
    assert hf_recipe({**c, "attn_rotary_emb": 4, "partial_rotary_factor": 0.5})["pattern"] == "SM AM"  # (they agree)
    from recipes.hf import hf_training

    assert hf_training(c) == {} and hf_training({**c, "z_loss_coefficient": 1e-4}) == {"z_loss": 1e-4}
    with pytest.raises(ValueError, match=r"z_loss_coefficient=-1 must be a finite number >= 0"):
        hf_training({**c, "z_loss_coefficient": -1})
    for field, value, message in [
            ("mamba_proj_bias", True, "mamba_proj_bias=True"),
            ("time_step_limit", [0.0, 1.0], "time_step_limit=[0.0, 1.0]"),
            ("attn_rotary_emb", 8, "attn_rotary_emb=8 (transformers turns head_dim·partial_rotary_factor = 8·0.5 = 4 "
                                   "channels; other readers take attn_rotary_emb)"),
            ("partial_rotary_factor", 1.0, "partial_rotary_factor=1.0 at the top level, which transformers replaces "
                                           "by 0.5"),
            ("attn_layer_indices", [2], "attn_layer_indices=[2]: layer numbers from 0 to num_hidden_layers - 1 = 1"),
            ("attn_layer_indices", [True], "attn_layer_indices=[True]: layer numbers"),
            ("mamba_n_heads", 3, "mamba_n_heads·mamba_d_head = 30 != mamba_expand·hidden_size = 32")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            hf_recipe({**c, field: value})
    with pytest.raises(ValueError, match=r"head_dim·rope_fraction = 8·0.1 = 0.8 must be an even whole number"):
        from recipes.hf import build

        build(hf_recipe({**c, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                  "partial_rotary_factor": 0.1}}))


def moe_files(tensors: dict[str, torch.Tensor], block: str, gate: str, up: str, down: str) -> dict[str, torch.Tensor]:
    """A transformers MoE's tensors by its modules' names (``mlp.gate``, ``mlp.experts.gate_up_proj [E, 2·d_ff, d]``,
    ``down_proj [E, d, d_ff]``) → by the names of its files (``{block}.gate``, one ``gate``, ``up`` and ``down`` matrix
    per expert), as transformers' conversion writes them; the other tensors as they are."""
    files = {}
    for name, tensor in tensors.items():
        layer, _, rest = name.partition(".mlp.")
        if rest == "gate.weight":
            files[f"{layer}.{block}.gate.weight"] = tensor
        elif rest == "experts.gate_up_proj":
            for e, (gate_rows, up_rows) in enumerate(t.chunk(2) for t in tensor):
                files[f"{layer}.{block}.experts.{e}.{gate}.weight"] = gate_rows
                files[f"{layer}.{block}.experts.{e}.{up}.weight"] = up_rows
        elif rest == "experts.down_proj":
            for e, down_rows in enumerate(tensor):
                files[f"{layer}.{block}.experts.{e}.{down}.weight"] = down_rows
        else:  # (a dense MLP's, the attention's, the norms')
            files[name] = tensor
    return files


def mixtral_files(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return moe_files(tensors, "block_sparse_moe", "w1", "w3", "w2")


def qwen3_moe_files(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return moe_files(tensors, "mlp", "gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize("window", [5, None])
def test_a_mixtral_imports_equal_to_transformers_and_exports_back(tmp_path, window):
    """Mixtral is Mistral's stack with its MLP replaced by a routed MoE: a softmax over every expert, the top-k
    renormalised, SwiGLU experts — the zoo's ``RoutedMoE(normalize=True)`` (letter ``R``) — here 4 experts, 2 a token,
    with and without a sliding window of 5 over 19 tokens. Its files hold one matrix per expert, the zoo stacks
    them. Equal to transformers' model on logits, a left-padded batch, every gradient (the router's too), decoding one
    token at a time and greedy ids; it exports as a Mixtral that transformers loads with equal logits and that imports
    again bit for bit."""
    from recipes.hf import read_config

    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=12, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                                        sliding_window=window, eos_token_id=None)  # (greedy ids: no early stop)
    theirs = saved_random(transformers.MixtralForCausalLM, config, tmp_path / "mixtral")
    ours = imports_equal_to_transformers(theirs, tmp_path / "mixtral", as_files=mixtral_files)
    moe = ours.blocks[0].state_mixer
    assert ours.pattern == "AR×2" and type(moe).__name__ == "RoutedMoE" and moe.router.normalize
    assert {b.sequence_mixer.sliding_window for b in ours.blocks} == {window}
    assert exports_to_transformers(ours, tmp_path / "exported") == "MixtralForCausalLM"
    written = read_config(tmp_path / "exported")
    assert (written["num_local_experts"], written["num_experts_per_tok"], written["sliding_window"]) == (4, 2, window)


def test_what_keeps_a_model_from_mixtral_and_the_mixtral_fields_an_import_refuses_are_named():
    from components import HybridLM
    from recipes.hf.architectures import Mixtral

    def model(pattern="AR×2", a=None, r=None, **mixers):
        return HybridLM(32, 16, pattern, {
            "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, **(a or {})}},
            "R": {"class_path": "components.RoutedMoE", "init_args": {"n_experts": 4, "top_k": 2, "d_ff": 8,
                                                                      "normalize": True, **(r or {})}}, **mixers})

    assert Mixtral.mismatch(model()) is None and Mixtral.mismatch(model(a={"sliding_window": 6})) is None
    moe_not_mixtrals = "its MoE is not Mixtral's (a TopKRouter with normalised gates over SwiGLU experts"
    for built, reason in [
            (model("AR AM", M={"class_path": "components.MLP"}), "its pattern has blocks ['AM', 'AR']"),
            (model(r={"normalize": False}), moe_not_mixtrals),
            (model(r={"activation": "swisig"}), moe_not_mixtrals),
            (model("AR×2", R={"class_path": "components.SharedExpertMoE", "init_args": {"n_experts": 4, "d_ff": 8,
                                                                                      "normalize": True}}),
             moe_not_mixtrals),
            (model("AR×2", R={"class_path": "components.MLP"}), "its 'A'/'R' letters are QCAttention/MLP"),
            (model(A={"class_path": "components.InnerFuncAttention", "init_args": {"n_heads": 2}}),
             "its 'A'/'R' letters are InnerFuncAttention/RoutedMoE"),
            (model(a={"qk_norm": True}), "its attention has no RoPE or has a QK-norm, which Mixtral has not")]:
        assert reason in (Mixtral.mismatch(built) or ""), reason
    from recipes.hf.architectures import Llama

    moe_as_m = model("AM×2", M={"class_path": "components.RoutedMoE", "init_args": {"n_experts": 4, "d_ff": 8}})
    assert Llama.mismatch(moe_as_m).startswith("its 'A'/'M' letters are QCAttention/RoutedMoE; a LlamaForCausalLM")
    c = {"architectures": ["MixtralForCausalLM"], "vocab_size": 32, "hidden_size": 16, "intermediate_size": 8,
         "num_hidden_layers": 2, "num_attention_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 64}
    recipe = hf_recipe(c)  # (MixtralConfig's defaults: 8 experts, 2 a token, no window)
    assert recipe["mixers"]["R"]["init_args"] == {"n_experts": 8, "top_k": 2, "d_ff": 8, "act": "silu", "normalize": True}
    assert "sliding_window" not in recipe["mixers"]["A"]["init_args"]
    with pytest.raises(ValueError, match=r"router_jitter_noise=0.1 \(the zoo computes only 0.0\)"):
        hf_recipe({**c, "router_jitter_noise": 0.1})


@pytest.mark.parametrize("settings, pattern", [
    ({"mlp_only_layers": [1], "norm_topk_prob": False}, "AR AM AR AR"),
    ({"decoder_sparse_step": 2, "norm_topk_prob": True, "use_sliding_window": True, "sliding_window": 5}, "AM AR AM AR"),
], ids=["dense-layer-1", "every-second-layer-normalised-window-5"])
def test_a_qwen3_moe_imports_equal_to_transformers_and_exports_back(tmp_path, settings, pattern):
    """Qwen3-MoE is Qwen3's attention (QK-norm) with a routed MoE — a softmax over every expert and its top-k,
    renormalised where ``norm_topk_prob`` — in the layers ``mlp_only_layers`` and ``decoder_sparse_step`` leave to it
    and a SwiGLU MLP in the others: the zoo's ``RoutedMoE`` (``R``) and ``MLP`` (``M``) blocks. Four layers, 4 experts
    of 12 channels, 2 a token, the dense MLP 24: equal to transformers' model on logits, a left-padded batch, every
    gradient, decoding one token at a time and greedy ids; it exports as a Qwen3-MoE that transformers loads with equal
    logits and that imports again bit for bit."""
    from recipes.hf import read_config

    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=24, moe_intermediate_size=12,
                                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                                         rms_norm_eps=1e-5, **settings)
    theirs = saved_random(transformers.Qwen3MoeForCausalLM, config, tmp_path / "qwen3_moe")
    ours = imports_equal_to_transformers(theirs, tmp_path / "qwen3_moe", as_files=qwen3_moe_files)
    assert ours.pattern == pattern
    routed = next(b.state_mixer for b in ours.blocks if b.token == "AR")
    assert routed.router.normalize == settings["norm_topk_prob"]
    assert {b.sequence_mixer.sliding_window for b in ours.blocks} == {settings.get("sliding_window")}
    assert exports_to_transformers(ours, tmp_path / "exported") == "Qwen3MoeForCausalLM"
    written = read_config(tmp_path / "exported")
    assert [i for i, token in enumerate(pattern.split()) if token == "AM"] == written["mlp_only_layers"]


def test_what_keeps_a_model_from_qwen3_moe_and_the_fields_an_import_reads_are_named():
    from components import HybridLM
    from recipes.hf.architectures import Qwen3Moe

    def model(pattern="AR AM", a=None, r=None, m=None, **mixers):
        return HybridLM(32, 16, pattern, {
            "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "qk_norm": True, **(a or {})}},
            "R": {"class_path": "components.RoutedMoE", "init_args": {"n_experts": 4, "top_k": 2, "d_ff": 8, **(r or {})}},
            "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24, **(m or {})}}, **mixers}, norm_eps=1e-6)

    assert Qwen3Moe.mismatch(model()) is None and Qwen3Moe.mismatch(model(r={"normalize": True})) is None
    for built, reason in [
            (model(m={"act": "gelu"}), "its MLPs and experts use different activations ['gelu', 'silu']; a Qwen3MoeFor"),
            (model(a={"qk_norm": False}), "its attention has no RoPE or no QK-norm; Qwen3Moe's has both"),
            (model("AR AM SM", S={"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8}}),
             "its pattern has blocks ['AM', 'AR', 'SM']; a Qwen3MoeForCausalLM is QCAttention with a QK-norm + SwiGLU "
             "MLP or routed MoE in every block ('AM', 'AR')"),
            (model(r={"activation": "swisig"}), "its MoE is not Qwen3Moe's (a TopKRouter over SwiGLU experts")]:
        assert reason in (Qwen3Moe.mismatch(built) or ""), reason
    c = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 32, "hidden_size": 16, "intermediate_size": 8,
         "num_hidden_layers": 3, "num_attention_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 64}
    recipe = hf_recipe(c)  # (Qwen3MoeConfig's defaults: 128 experts, 8 a token, 768 channels, gates as they are)
    assert recipe["pattern"] == "AR×3" and "M" not in recipe["mixers"]
    assert recipe["mixers"]["R"]["init_args"] == {"n_experts": 128, "top_k": 8, "d_ff": 768, "act": "silu",
                                                  "normalize": False}
    assert hf_recipe({**c, "num_local_experts": 6})["mixers"]["R"]["init_args"]["n_experts"] == 6  # (5.x writes it)
    assert hf_recipe({**c, "num_experts": 0})["pattern"] == "AM×3"  # (no experts: every layer dense)
    with pytest.raises(ValueError, match=r"num_experts=6 and num_local_experts=4 disagree"):
        hf_recipe({**c, "num_experts": 6, "num_local_experts": 4})
    with pytest.raises(ValueError, match=r"decoder_sparse_step=0: a whole number of layers, at least 1, expected"):
        hf_recipe({**c, "decoder_sparse_step": 0})


def test_the_weights_are_cut_into_shards_of_at_most_max_shard_size_bytes(tmp_path):
    """A shard takes tensors while they fit (exactly full is full enough); one file where all fit, named
    ``model.safetensors``; the index maps each tensor to its shard and gives the total. Sizes as transformers
    writes them (``2GB``, ``500MB``, bytes), one byte the least."""
    from safetensors.torch import load_file

    from recipes.hf import shard_size, write_weights

    assert shard_size(1000) == shard_size("1000") == shard_size("1KB") == 1000 and shard_size(" 1.5 mb ") == 1_500_000
    assert shard_size("1") == shard_size("1B") == 1
    for size in (0, "0.4B"):
        with pytest.raises(ValueError, match=f"max_shard_size {size!r} is under one byte"):
            shard_size(size)
    state = {"a": torch.zeros(2), "b": torch.ones(2), "c": torch.full((4,), 2.0)}  # 8, 8 and 16 bytes
    for size, files in ((16, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]),
                        (32, ["model.safetensors"])):
        (tmp_path / str(size)).mkdir()
        assert write_weights(state, tmp_path / str(size), size) == files
        read = {name: tensor for file in files for name, tensor in load_file(tmp_path / str(size) / file).items()}
        assert read.keys() == state.keys() and all(torch.equal(read[k], v) for k, v in state.items())
    index = json.loads((tmp_path / "16" / "model.safetensors.index.json").read_text())
    assert index == {"metadata": {"total_size": 32}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                                    "b": "model-00001-of-00002.safetensors",
                                                                    "c": "model-00002-of-00002.safetensors"}}
    assert not (tmp_path / "32" / "model.safetensors.index.json").exists()


def nemotron_files(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Nemotron-H's tensors by its modules' names (``model.…``, ``mixer.experts.up_proj [E, d_ff, d]``,
    ``down_proj [E, d, d_ff]``) → by the names of its files (``backbone.…``, one ``up_proj`` and ``down_proj`` matrix
    per expert), as transformers' conversion writes them; the router's correction bias (a buffer: no gradient) as
    zeros."""
    files = {}
    for name, tensor in tensors.items():
        name = name.replace("model.", "backbone.", 1) if name.startswith("model.") else name
        if name.endswith(("mixer.experts.up_proj", "mixer.experts.down_proj")):
            stem, kind = name.rsplit(".", 1)
            files.update({f"{stem}.{e}.{kind}.weight": matrix for e, matrix in enumerate(tensor)})
        else:
            files[name] = tensor
    return with_correction_bias(files, "mixer.gate.weight")


def with_correction_bias(files: dict[str, torch.Tensor], router: str) -> dict[str, torch.Tensor]:
    """``files`` and, beside each ``router`` weight, its DeepSeek-V3 correction bias (a buffer: no gradient) as zeros."""
    return files | {name.replace(".weight", ".e_score_correction_bias"): torch.zeros(tensor.shape[0])
                    for name, tensor in files.items() if name.endswith(router)}


@pytest.mark.parametrize("settings", [
    {"attention_bias": True, "use_qk_norm": True, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5},
    {"head_dim": 12, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1 / 3},
     "norm_topk_prob": False, "first_k_dense_replace": 0, "hidden_act": "gelu"},
], ids=["biases, QK-norm, groups", "wide heads, a third RoPE, unnormalised"])
def test_a_glm4_moe_imports_equal_to_transformers_with_its_partial_rope_and_deepseek_v3s_router(tmp_path, settings):
    """GLM-4.5 (GLM-4.5-Air's class) is Llama's attention turning part of each head by RoPE (half unless its config says),
    with biases on the query, key and value projections and a QK-norm where its config asks, and DeepSeek-V3's MoE
    after its dense first layers (as dots.llm1's): 8 experts, 2 a token, a random correction bias, one shared expert.
    Two configurations, against transformers' model: logits, a left-padded batch, every gradient, decoding one token
    at a time and greedy ids. The biases are drawn at random (transformers starts them at zero)."""
    torch.manual_seed(0)
    config = transformers.Glm4MoeConfig(**{
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 40, "moe_intermediate_size": 12,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "n_shared_experts": 1, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
        **settings})

    def correction_bias(model):
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0, 0.1)

    theirs = saved_random(transformers.Glm4MoeForCausalLM, config, tmp_path / "glm", correction_bias)
    ours = imports_equal_to_transformers(theirs, tmp_path / "glm", as_files=dots1_files)
    dense = settings.get("first_k_dense_replace", 1)
    assert ours.pattern == ("AM AE AE" if dense else "AE×3")
    attention, router = ours.blocks[0].sequence_mixer, ours.blocks[2].state_mixer.router
    assert attention.positions.rope_fraction == pytest.approx(0.5 if dense else 1 / 3)
    assert (attention.qkv_bias, attention.positions.q_norm is not None) == ((True, True) if dense else (False, False))
    assert (router.n_groups, router.scale, router.normalize) == ((4, 2.5, True) if dense else (1, 1.0, False))
    torch.testing.assert_close(router.balance_bias, theirs.model.layers[2].mlp.gate.e_score_correction_bias)


def test_what_a_glm4_moe_config_says_is_read_as_transformers_reads_it():
    """Where the config is silent, Glm4MoeConfig's defaults (a dense first layer, 128 experts of width 1,408, 8 a token,
    normalised, one shared, half of each head turned); ``partial_rotary_factor`` at the top level (the hub's files) or
    in ``rope_parameters``, two that disagree refused; the multi-token-prediction layer its files keep after the
    others dropped, a weight of any other layer not."""
    from components import HybridLM
    from recipes.hf.architectures import to_hf, to_zoo

    c = {"architectures": ["Glm4MoeForCausalLM"], "vocab_size": 32, "hidden_size": 16, "intermediate_size": 8,
         "num_hidden_layers": 2, "num_attention_heads": 2, "rms_norm_eps": 1e-6, "partial_rotary_factor": 0.25,
         "head_dim": 16}
    recipe = hf_recipe(c)
    assert recipe["pattern"] == "AM AE" and recipe["mixers"]["A"]["init_args"]["rope_fraction"] == 0.25
    moe = recipe["mixers"]["E"]["init_args"]
    assert moe["router"]["init_args"] | {"n_groups": 1} == {"n_experts": 128, "top_k": 8, "normalize": True,
                                                            "scale": 1.0, "n_groups": 1, "top_groups": 1}
    assert (moe["experts"]["init_args"]["d_ff"], moe["shared_expert"]["init_args"]["d_ff"]) == (1408, 1408)
    assert hf_recipe({k: v for k, v in c.items() if k != "partial_rotary_factor"})["mixers"]["A"]["init_args"][
        "rope_fraction"] == 0.5
    with pytest.raises(ValueError, match=r"fields that disagree on RoPE: partial_rotary_factor=0.25 at the top level "
                                         r"and 0.5 in rope_parameters"):
        hf_recipe({**c, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}})
    small = {**c, "n_routed_experts": 2, "moe_intermediate_size": 4, "num_experts_per_tok": 1,
             "num_nextn_predict_layers": 1}
    model = HybridLM(**hf_recipe(small))
    files = to_hf(small, model.state_dict())  # (the files' names: the layers 0 and 1, as transformers writes them)
    assert set(to_zoo(small, files | {"model.layers.2.eh_proj.weight": torch.zeros(1)})) == set(model.state_dict())
    with pytest.raises(ValueError, match=r"weights the zoo has no place for: \['model.layers.3.eh_proj.weight'\]"):
        to_zoo(small, files | {"model.layers.3.eh_proj.weight": torch.zeros(1)})


@pytest.mark.parametrize("settings", [{}, {"conv_bias": True, "conv_L_cache": 4, "tie_word_embeddings": False,
                                          "block_auto_adjust_ff_dim": False}], ids=["LFM2's", "biases, 4 taps"])
def test_an_lfm2_imports_equal_to_transformers_with_its_gated_short_convolutions_and_exports_back(tmp_path, settings):
    """LFM2 is gated short convolutions (``ShortConv``) and attention with a QK-norm, each layer with a SwiGLU MLP whose
    width transformers derives (two thirds of 96, rounded up to a multiple of 16: 64). An independent check of
    ``ShortConv``: equal to transformers' model on logits, a left-padded batch, every gradient, decoding one token at a
    time (transformers' conv cache against the zoo's window) and greedy ids; it exports as an LFM2 that transformers
    loads with equal logits and that imports again bit for bit."""
    torch.manual_seed(0)
    config = transformers.Lfm2Config(vocab_size=64, hidden_size=32, intermediate_size=96, block_multiple_of=16,
                                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                     layer_types=["conv", "full_attention", "conv", "conv"], max_position_embeddings=64,
                                     pad_token_id=0, **settings)

    def biases(model):  # in_proj's bias kept for c alone: transformers passes b·h from padding on, bias ⊙ bias
        for name, p in model.named_parameters():  # (and a gradient back to it), where the zoo passes nothing
            if name.endswith("conv.bias"):
                p.uniform_(-0.5, 0.5)
            elif name.endswith("in_proj.bias"):
                p[:32], p[64:] = 0.0, 0.0

    theirs = saved_random(transformers.Lfm2ForCausalLM, config, tmp_path / "lfm2", biases)
    ours = imports_equal_to_transformers(theirs, tmp_path / "lfm2")
    assert ours.pattern == "CM AM CM CM"
    conv = ours.blocks[0].sequence_mixer
    assert (type(conv).__name__, conv.conv.kernel_size[0], conv.bias) == (
        "ShortConv", settings.get("conv_L_cache", 3), settings.get("conv_bias", False))
    assert ours.blocks[0].state_mixer.d_ff == (96 if settings else 64)
    assert ours.tie_embeddings == (not settings)
    assert exports_to_transformers(ours, tmp_path / "exported") == "Lfm2ForCausalLM"


def test_what_an_lfm2_config_says_is_read_as_transformers_reads_it_and_what_keeps_a_model_from_one():
    """The hub's files: ``block_ff_dim`` over ``intermediate_size``, ``full_attn_idxs`` for the layer types (every
    layer attends where there are neither), the MLP's width derived with or without a multiplier, the fields that
    repeat others honoured where equal and refused by name where not; and a zoo model that is not an LFM2, named."""
    from components import HybridLM
    from recipes.hf.architectures import Lfm2

    hub = {"architectures": ["Lfm2ForCausalLM"], "vocab_size": 32, "hidden_size": 16, "block_dim": 16,
           "block_ff_dim": 96, "intermediate_size": 12288, "block_multiple_of": 16, "block_ffn_dim_multiplier": 1.0,
           "num_hidden_layers": 3, "num_attention_heads": 2, "num_heads": 2, "num_key_value_heads": 1,
           "full_attn_idxs": [1], "conv_dim": 16, "conv_dim_out": 16, "norm_eps": 1e-5, "block_norm_eps": 1e-5,
           "block_use_swiglu": True, "use_pos_enc": True, "block_use_xavier_init": True, "rope_theta": 1e6}
    recipe = hf_recipe(hub)
    assert recipe["pattern"] == "CM AM CM" and recipe["mixers"]["M"]["init_args"]["d_ff"] == 64
    assert recipe["tie_embeddings"] and recipe["padding_idx"] == 0  # (Lfm2Config's defaults)
    assert not hf_recipe({**hub, "tie_word_embeddings": True, "tie_embedding": False})["tie_embeddings"]
    assert hf_recipe({**hub, "block_ffn_dim_multiplier": None})["mixers"]["M"]["init_args"]["d_ff"] == 64 * 1
    assert hf_recipe({**hub, "block_ff_dim": 100, "block_ffn_dim_multiplier": None})["mixers"]["M"]["init_args"][
        "d_ff"] == 66  # (two thirds, not rounded: transformers rounds only with a multiplier)
    assert hf_recipe({k: v for k, v in hub.items() if k != "full_attn_idxs"})["pattern"] == "AM×3"
    with pytest.raises(ValueError, match=r"conv_dim=24 \(transformers reads hidden_size=16\); use_pos_enc=False "
                                         r"\(the zoo computes only True\)"):
        hf_recipe({**hub, "conv_dim": 24, "use_pos_enc": False})
    with pytest.raises(ValueError, match=r"layer_types=\['conv', 'attention', 'conv'\]: num_hidden_layers=3 of "
                                         r"full_attention, conv expected"):
        hf_recipe({**hub, "layer_types": ["conv", "attention", "conv"]})
    model = HybridLM(**hf_recipe(hub))
    assert Lfm2.mismatch(model) is None
    model.blocks[1].sequence_mixer.positions.q_norm.eps = 1e-6
    assert Lfm2.mismatch(model).startswith("its attention is not LFM2's")
    mixed = HybridLM(32, 16, "CM DM", {"C": {"class_path": "components.ShortConv", "init_args": {}},
                                       "D": {"class_path": "components.ShortConv", "init_args": {"kernel_size": 4}},
                                       "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}}})
    assert Lfm2.mismatch(mixed).startswith("it has no attention block, and transformers' LFM2 fails without one")
    mixed = HybridLM(32, 16, "CM DM AM", {"C": {"class_path": "components.ShortConv", "init_args": {}},
                                          "D": {"class_path": "components.ShortConv", "init_args": {"kernel_size": 4}},
                                          "A": {"class_path": "components.QCAttention",
                                                "init_args": {"n_heads": 2, "qk_norm": True, "norm_eps": 1e-6}},
                                          "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}}})
    assert Lfm2.mismatch(mixed) == "its ShortConvs differ in taps or biases; LFM2 has one conv_L_cache and one conv_bias"
    ssd = HybridLM(32, 16, "CM SM", {"C": {"class_path": "components.ShortConv", "init_args": {}},
                                     "S": {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8}},
                                     "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24}}})
    assert Lfm2.mismatch(ssd).startswith("its blocks hold ['SSD/MLP', 'ShortConv/MLP']; an Lfm2ForCausalLM is")


def test_a_qwen2_moe_imports_equal_to_transformers_with_its_sigmoid_gated_shared_expert(tmp_path):
    """Qwen2-MoE (Qwen1.5-MoE's class): Qwen2's attention with its biases, a dense first layer (``mlp_only_layers``),
    then a softmax router over 4 experts, 2 a token, unnormalised, SwiGLU experts and a shared SwiGLU MLP that each
    token scales by ``σ(x · w)`` (``SigmoidGated``); its first layer windowed (5 keys of 19: Qwen2-MoE windows every
    other layer before ``max_window_layers``). Equal to transformers' model on logits, a left-padded batch, every
    gradient (the shared gate's too), decoding one token at a time and greedy ids; the biases drawn at random. A
    config without ``layer_types`` reads its windows as transformers does."""
    torch.manual_seed(0)
    config = transformers.Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=40, moe_intermediate_size=12,
                                         shared_expert_intermediate_size=20, num_hidden_layers=3, num_attention_heads=4,
                                         num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0],
                                         use_sliding_window=True, sliding_window=5, max_window_layers=2,
                                         rms_norm_eps=1e-5, max_position_embeddings=64)

    theirs = saved_random(transformers.Qwen2MoeForCausalLM, config, tmp_path / "qwen2moe")
    ours = imports_equal_to_transformers(theirs, tmp_path / "qwen2moe", as_files=qwen3_moe_files)
    assert ours.pattern == "WM AR AR"
    moe = ours.blocks[1].state_mixer
    assert type(moe.shared_expert).__name__ == "SigmoidGated" and moe.shared_expert.inner.d_ff == 20
    assert not moe.router.normalize and ours.blocks[0].sequence_mixer.qkv_bias
    c = {"architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 32, "hidden_size": 16, "intermediate_size": 8,
         "num_hidden_layers": 5, "num_attention_heads": 2, "rms_norm_eps": 1e-6, "num_experts": 2}
    assert hf_recipe({**c, "qkv_bias": False})["mixers"]["A"]["init_args"]["qkv_bias"] is False
    assert hf_recipe(c)["mixers"]["A"]["init_args"]["qkv_bias"] is True  # (Qwen1.5-MoE's files have no qkv_bias)
    assert hf_recipe({**c, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 4})["pattern"] == (
        "WR AR WR AR AR")
    assert hf_recipe({**c, "use_sliding_window": False, "sliding_window": 0})["pattern"] == "AR×5"


NEMOTRON_LAYERS = ["linear_attention", "mlp", "full_attention", "moe", "linear_attention", "moe"]


def nemotron(folder, **settings):
    """A tiny random Nemotron-H (Mamba-2, MLP, attention, MoE, Mamba-2, MoE; 8 experts in 4 groups, 2 of them a
    token's to choose from; scaled gates; a random correction bias), saved to ``folder``: transformers' model."""
    torch.manual_seed(0)
    config = transformers.NemotronHConfig(**{
        "vocab_size": 64, "hidden_size": 32, "layers_block_type": NEMOTRON_LAYERS, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 12, "intermediate_size": 24, "mamba_num_heads": 8, "mamba_head_dim": 8,
        "ssm_state_size": 16, "n_groups": 2, "chunk_size": 8, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 12, "moe_shared_expert_intermediate_size": 16, "n_group": 4, "topk_group": 2,
        "routed_scaling_factor": 2.5, "max_position_embeddings": 64, "eos_token_id": None, **settings})

    def correction_bias(model):  # (a buffer saved_random leaves at zero; it changes which experts are chosen)
        for layer in model.model.layers:
            if layer.block_type == "moe":
                layer.mixer.gate.e_score_correction_bias.normal_(0, 0.1)

    return saved_random(transformers.NemotronHForCausalLM, config, folder, correction_bias)


@pytest.mark.parametrize("settings", [{}, {"norm_topk_prob": False, "n_group": 1, "topk_group": 1,
                                           "mlp_hidden_act": "silu", "mamba_num_heads": 6}],
                         ids=["groups-normalised-relu2", "ungrouped-silu-mamba-width-48-of-32"])
def test_a_nemotron_h_imports_equal_to_transformers_and_exports_back(tmp_path, settings):
    """Nemotron-H is single-mixer layers behind one norm each: Mamba-2 (``S-``), attention without positions
    (``A-``), a plain relu² MLP (``-M``) and a MoE of DeepSeek-V3's sigmoid router (its correction bias the zoo's
    balancing bias), plain experts and a shared plain MLP (``-E``). Equal to transformers' model on logits, a
    left-padded batch, every gradient, decoding one token at a time and greedy ids; it exports as a Nemotron-H that
    transformers loads with equal logits and that imports again bit for bit, the balancing bias with it."""
    from recipes.hf import read_config

    theirs = nemotron(tmp_path / "nemotron", **settings)
    ours = imports_equal_to_transformers(theirs, tmp_path / "nemotron", as_files=nemotron_files)
    assert ours.pattern == "S- -M A- -E S- -E"
    assert ours.blocks[0].sequence_mixer.d_inner == theirs.model.layers[0].mixer.intermediate_size  # 64, or 48 of 32
    router = ours.blocks[3].state_mixer.router
    torch.testing.assert_close(router.balance_bias, theirs.model.layers[3].mixer.gate.e_score_correction_bias)
    assert (router.n_groups, router.top_groups, router.scale) == (settings.get("n_group", 4),
                                                                  settings.get("topk_group", 2), 2.5)
    assert exports_to_transformers(ours, tmp_path / "exported") == "NemotronHForCausalLM"
    written = read_config(tmp_path / "exported")
    assert written["layers_block_type"] == NEMOTRON_LAYERS and "num_hidden_layers" not in written


def test_an_older_nemotron_h_config_with_a_pattern_string_and_the_older_field_names_reads_as_transformers_reads_it():
    from recipes.hf.architectures import nemotron_tokens

    c = {"architectures": ["NemotronHForCausalLM"], "vocab_size": 32, "hidden_size": 16, "num_attention_heads": 2,
         "head_dim": 8, "intermediate_size": 24, "mamba_num_heads": 4, "mamba_head_dim": 8, "mamba_n_groups": 2,
         "ssm_state_size": 8, "mamba_d_conv": 3, "mamba_chunk_size": 16, "hybrid_override_pattern": "M-M*-",
         "num_hidden_layers": 5, "layer_norm_epsilon": 1e-5}
    recipe = hf_recipe(c)
    assert recipe["pattern"] == "S- -M S- A- -M" and recipe["norm_eps"] == 1e-5
    ssd = recipe["mixers"]["S"]["init_args"]
    assert (ssd["n_groups"], ssd["conv_kernel"], ssd["chunk_size"], ssd["expand"]) == (2, 3, 16, 2)
    assert recipe["mixers"]["M"]["init_args"] == {"d_ff": 24, "activation": "plain", "act": "relu2"}
    assert nemotron_tokens({"layer_types": ["moe", "mlp"]}) == ["-E", "-M"]
    narrow = hf_recipe({**c, "mamba_head_dim": 6})["mixers"]["S"]["init_args"]  # 4·6 = 24 channels in a width of 16
    assert narrow["d_inner"] == 24 and "expand" not in narrow
    nvidia = {k: v for k, v in c.items() if k != "head_dim"} | {"attention_head_dim": 12, "rms_norm_eps": 1e-5,
                                                                "auto_map": {"AutoConfig": "configuration.NemotronHConfig"}}
    assert hf_recipe(nvidia)["mixers"]["A"]["init_args"]["head_dim"] == 12  # (NVIDIA's own configs name it so)
    assert hf_recipe({k: v for k, v in c.items() if k != "head_dim"})["mixers"]["A"]["init_args"]["head_dim"] == 128
    for changes, message in [
            ({"hybrid_override_pattern": "M-X"}, r"hybrid_override_pattern='M-X': letters \['X'\] are none of M, \*, -, E"),
            ({"num_hidden_layers": 4}, "num_hidden_layers=4 but layers_block_type lists 5 layers"),
            ({"time_step_limit": [0.0, 1.0]}, r"time_step_limit=\[0.0, 1.0\] \(the zoo does not clamp Δ\)"),
            ({"mamba_conv_bias": False}, r"use_conv_bias=False, mamba_proj_bias=None \(the zoo's conv has a bias"),
            ({"mlp_hidden_act": "gelu_new"}, r"mlp_hidden_act='gelu_new' \(the zoo's MLPs take silu, gelu, relu, relu2\)"),
            ({"moe_latent_size": 8}, r"moe_latent_size=8 \(the zoo's experts read the model's width\)"),
            ({"num_nextn_predict_layers": 1}, r"num_nextn_predict_layers=1 \(multi-token prediction layers\)"),
            ({"mamba_hidden_act": "gelu"}, r"mamba_hidden_act='gelu' \(the zoo's conv is followed by SiLU\)"),
            ({"sliding_window": 8}, r"sliding_window=8 \(the zoo computes only None\)"),
            ({"attention_head_dim": 16}, "head_dim=8 and attention_head_dim=16 disagree"),
            ({"rms_norm_eps": 1e-6}, r"rms_norm_eps=1e-06 beside layer_norm_epsilon=1e-05 \(one eps for every norm\)")]:
        with pytest.raises(ValueError, match=message):
            hf_recipe({**c, **changes})
    with pytest.raises(ValueError, match="layers_block_type: the config lists no layers"):
        hf_recipe({k: v for k, v in c.items() if k != "hybrid_override_pattern"})


def test_what_keeps_a_model_from_nemotron_h_is_named():
    from components import HybridLM
    from recipes.hf.architectures import NemotronH

    moe = {"class_path": "components.ComposedMoE", "init_args": {
        "router": {"class_path": "components.SigmoidRouter", "init_args": {"n_experts": 4, "top_k": 2}},
        "experts": {"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 4, "d_ff": 8,
                                                                               "activation": "plain", "act": "relu2"}},
        "shared_expert": {"class_path": "components.MLP", "init_args": {"d_ff": 8, "activation": "plain", "act": "relu2"}}}}

    def model(pattern="S- -M A- -E", s=None, a=None, m=None, **mixers):
        return HybridLM(32, 16, pattern, {
            "S": {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "expand": 2, "conv": True,
                                                               "rope": False, "gate": True, "norm_eps": 1e-5, **(s or {})}},
            "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "rope": False, **(a or {})}},
            "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24, "activation": "plain", "act": "relu2",
                                                               **(m or {})}},
            "E": moe, **mixers}, norm_eps=1e-5)

    assert NemotronH.mismatch(model()) is None
    softmax_moe = {"class_path": "components.SharedExpertMoE", "init_args": {"n_experts": 4, "d_ff": 8}}
    for built, reason in [
            (model("SM A- -M"), "its block 'SM' holds SSD and MLP; a NemotronHForCausalLM is single-mixer blocks"),
            (model("S- -M -E"), "it has no attention block, and transformers' Nemotron-H fails without one"),
            (model(a={"rope": True}), "its attention has RoPE, a QK-norm, a window or query/key/value biases; Nemotron-H's "
                                      "has none of them"),
            (model(a={"qkv_bias": True}), "its attention has RoPE, a QK-norm, a window or query/key/value biases"),
            (model(s={"gate": False}), "its SSDs are not all Mamba-2's (conv, D and the gate, no RoPE)"),
            (model(s={"norm_eps": 1e-6}), "its SSDs' gate norms have another eps than its other norms (1e-05)"),
            (model(m={"activation": "swiglu", "act": "silu"}), "its MLPs are ['swiglu']; Nemotron-H's are plain"),
            (model(m={"act": "silu"}), "its MLPs and experts use ['relu2', 'silu']; Nemotron-H has one mlp_hidden_act"),
            (model(E=softmax_moe), "its MoE is not Nemotron-H's (a SigmoidRouter, plain MLPExperts"),
            (model("S- A- A- -M", A={"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "rope": False}},
                   B={"class_path": "components.QCAttention", "init_args": {"n_heads": 4, "rope": False}}),
             None),
            (model("A- B- -M", B={"class_path": "components.QCAttention", "init_args": {"n_heads": 4, "rope": False}}),
             "its attentions (heads, key/value heads, head_dim) differ: [(2, 2, 8), (4, 4, 4)]; Nemotron-H has one")]:
        got = NemotronH.mismatch(built)
        assert (got is None) if reason is None else reason in (got or ""), (reason, got)


def test_a_tied_model_exports_as_a_nemotron_h_with_a_head_of_its_own_and_a_tied_config_imports_untied(tmp_path):
    """transformers' Nemotron-H never ties its head to its embedding, whatever ``tie_word_embeddings`` says (5.25):
    a folder that says so imports with the head its files hold, and a tied zoo model exports with its head written out
    as a tensor of its own, to the same logits in transformers."""
    from components import HybridLM
    from recipes.hf import read_config

    theirs = nemotron(tmp_path / "said-tied", tie_word_embeddings=True)
    assert not torch.equal(theirs.lm_head.weight, theirs.model.embeddings.weight)
    ours = from_pretrained(tmp_path / "said-tied")
    assert not ours.tie_embeddings and torch.equal(ours.lm_head.weight, theirs.lm_head.weight)
    torch.manual_seed(1)
    tied = HybridLM(32, 16, "S- A- -M", {
        "S": {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "expand": 2, "conv": True,
                                                           "rope": False, "gate": True, "norm_eps": 1e-5}},
        "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "rope": False}},
        "M": {"class_path": "components.MLP", "init_args": {"d_ff": 24, "activation": "plain", "act": "relu2"}}},
        norm_eps=1e-5, tie_embeddings=True).eval()
    from recipes.hf import export

    export(tied, tmp_path / "exported")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    ids = torch.randint(0, 32, (2, T))
    with torch.no_grad():
        assert relative_error(tied(ids), again(ids).logits) <= 1e-5
    assert read_config(tmp_path / "exported")["tie_word_embeddings"] is False


def test_an_ssd_whose_width_is_no_multiple_of_the_models_exports_only_as_nemotron_h():
    """Mamba-2's, Granite's and Bamba's configs give the Mamba width as ``expand`` times the model's; Nemotron-H's as
    heads times head width. An ``SSD(d_inner=…)`` 48 channels wide in a width of 32 is refused by the first by name."""
    from components import HybridLM
    from recipes.hf.architectures import Bamba, GraniteHybrid, Mamba2, NemotronH

    ssd = {"class_path": "components.SSD", "init_args": {"d_inner": 48, "head_dim": 8, "d_state": 8, "conv": True,
                                                         "rope": False, "gate": True, "norm_eps": 1e-5}}
    attention = {"class_path": "components.QCAttention", "init_args": {"n_heads": 4, "rope": False}}
    mlp = {"class_path": "components.MLP", "init_args": {"d_ff": 24}}
    plain = {"class_path": "components.MLP", "init_args": {"d_ff": 24, "activation": "plain", "act": "relu2"}}
    mamba = HybridLM(32, 32, "S-×2", {"S": ssd}, norm_eps=1e-5)
    assert Mamba2.mismatch(mamba) == ("its SSD is d_inner=48 wide, no whole multiple of its width; Mamba-2's config "
                                      "has expand")
    hybrid = HybridLM(32, 32, "SM AM", {"S": ssd, "A": attention, "M": mlp}, norm_eps=1e-5)
    for adapter, name in ((GraniteHybrid, "Granite"), (Bamba, "Bamba")):
        assert (f"its SSDs are d_inner=48 wide, no whole multiple of its width; {name}'s config has mamba_expand"
                in adapter.mismatch(hybrid)), adapter.mismatch(hybrid)
    assert NemotronH.mismatch(HybridLM(32, 32, "S- A- -M", {"S": ssd, "A": attention, "M": plain}, norm_eps=1e-5)) is None


def test_an_imported_nemotron_h_fine_tunes_its_moe_balanced_by_the_routers_bias_alone(tmp_path):
    """The fine-tuning recipe of a Nemotron-H with MoE layers sets no balancing loss (``aux_loss_coef: 0``): its
    routers balance by their bias, which a fine-tuning step moves; a dense one leaves the coefficient to the default."""
    from recipes import LanguageModel
    from recipes.hf import hf_training, write_checkpoint
    from recipes.hf.tokenizer import END_OF_DOCUMENT, byte_tokenizer

    nemotron(tmp_path / "n", vocab_size=257)
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens([END_OF_DOCUMENT])
    tokenizer.save(str(tmp_path / "n" / "tokenizer.json"))
    checkpoint, recipe = write_checkpoint(tmp_path / "n", tmp_path / "out" / "n.ckpt")
    assert yaml.safe_load(recipe.read_text())["model"]["aux_loss_coef"] == 0.0
    lm = LanguageModel.load_from_checkpoint(checkpoint)
    router = lm.model.blocks[3].state_mixer.router
    assert router.balance_rate == 1e-3 and router.balance_bias.abs().sum() > 0  # (the folder's bias, kept)
    dense = {"architectures": ["NemotronHForCausalLM"], "layers_block_type": ["linear_attention", "mlp"]}
    assert hf_training(dense) == {}


def dots1_files(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """dots.llm1's tensors as its files name them: the experts one matrix each (as Qwen3-MoE's), the router's
    correction bias (a buffer: no gradient) as zeros."""
    return with_correction_bias(qwen3_moe_files(tensors), "mlp.gate.weight")


def test_a_dots1_imports_equal_to_transformers_with_deepseek_v3s_router(tmp_path):
    """dots.llm1 is Qwen3's attention with DeepSeek-V3's MoE: a dense first layer, then a sigmoid router over 8 experts
    in 4 groups (2 of them a token's to choose from), normalised gates scaled by 2, a random correction bias, SwiGLU
    experts and a shared SwiGLU MLP of two experts' width; its last layer windowed (5 keys of 19). Equal to
    transformers' model on logits, a left-padded batch, every gradient, decoding one token at a time and greedy ids."""
    torch.manual_seed(0)
    config = transformers.Dots1Config(vocab_size=64, hidden_size=32, intermediate_size=24, moe_intermediate_size=12,
                                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                      n_shared_experts=2, n_routed_experts=8, n_group=4, topk_group=2,
                                      num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True,
                                      routed_scaling_factor=2.0, sliding_window=5, max_window_layers=2,
                                      rms_norm_eps=1e-5, max_position_embeddings=64)

    def correction_bias(model):
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.1)

    theirs = saved_random(transformers.Dots1ForCausalLM, config, tmp_path / "dots1", correction_bias)
    ours = imports_equal_to_transformers(theirs, tmp_path / "dots1", as_files=dots1_files)
    assert ours.pattern == "AM AE WE"
    router = ours.blocks[1].state_mixer.router
    assert (type(router).__name__, router.n_groups, router.top_groups, router.scale) == ("SigmoidRouter", 4, 2, 2.0)
    torch.testing.assert_close(router.balance_bias, theirs.model.layers[1].mlp.gate.e_score_correction_bias)
    assert ours.blocks[2].sequence_mixer.sliding_window == 5 and ours.blocks[1].sequence_mixer.sliding_window is None
    c = {"architectures": ["Dots1ForCausalLM"], "vocab_size": 32, "hidden_size": 16, "intermediate_size": 8,
         "moe_intermediate_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2, "rms_norm_eps": 1e-6,
         "n_routed_experts": 4, "num_experts_per_tok": 1, "n_shared_experts": 1}
    assert hf_recipe(c)["pattern"] == "AE×2"  # (Dots1Config's defaults: no dense layer, no window below 62 layers)
    # without layer_types, as transformers reads it: windowed from max_window_layers on, unless sliding_window is null
    assert hf_recipe({**c, "max_window_layers": 1, "sliding_window": 5})["pattern"] == "AE WE"
    assert hf_recipe({**c, "max_window_layers": 1, "sliding_window": None})["pattern"] == "AE×2"
    with pytest.raises(ValueError, match="the required key 'n_shared_experts' is missing"):
        hf_recipe({k: v for k, v in c.items() if k != "n_shared_experts"})


def falcon_h1(tmp_path, **settings):
    """A tiny random Falcon-H1 (attention and Mamba-2 side by side in each of 2 layers; its Mamba-2 48 channels wide
    in a width of 32, ``mamba_d_ssm``), saved: transformers' model and its folder."""
    torch.manual_seed(0)
    config = transformers.FalconH1Config(**{
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "mamba_d_ssm": 48, "mamba_n_heads": 6, "mamba_d_state": 8,
        "mamba_n_groups": 2, "mamba_chunk_size": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, **settings})
    return saved_random(transformers.FalconH1ForCausalLM, config, tmp_path / "falcon_h1"), tmp_path / "falcon_h1"


FALCON_H1_GATES = {"gate alone": {}, "norm, then gate": {"mamba_rms_norm": True},
                   "gate, then norm": {"mamba_rms_norm": True, "mamba_norm_before_gate": False}}


@pytest.mark.parametrize("gate", FALCON_H1_GATES)
def test_a_falcon_h1_imports_equal_to_transformers_with_attention_and_mamba2_side_by_side_and_exports_back(tmp_path, gate):
    """An independent check of ``ParallelMixers`` and of the SSD gate's forms: TII's Falcon-H1 (attention and Mamba-2
    reading the same normed input in every layer, their outputs summed; its Mamba-2's gate alone, after a grouped
    RMSNorm or before one) imports equal to transformers' model — logits, a left-padded batch, every gradient, decoding
    one token at a time (transformers' hybrid cache against the zoo's two caches) and greedy ids — and exports back to
    a folder transformers loads with equal logits, then imports again bit for bit."""
    theirs, folder = falcon_h1(tmp_path, **FALCON_H1_GATES[gate])
    ours = imports_equal_to_transformers(theirs, folder)
    assert ours.pattern == "PM×2"
    ssd = ours.blocks[0].sequence_mixer.mixers[1]
    assert (ssd.d_inner, ssd.n_heads, ssd.gate_norm is not None, ssd.norm_before_gate) == (
        48, 6, gate != "gate alone", gate == "norm, then gate")
    assert exports_to_transformers(ours, tmp_path / "exported") == "FalconH1ForCausalLM"


FALCON_H1_MULTIPLIERS = dict(embedding_multiplier=1.7, lm_head_multiplier=0.6, key_multiplier=1.3,
                             attention_in_multiplier=0.8, attention_out_multiplier=1.2, ssm_in_multiplier=1.1,
                             ssm_out_multiplier=0.7, mlp_multipliers=[1.4, 0.9], ssm_multipliers=[1.5, 0.6, 1.2, 0.8, 1.3])


def test_falcon_h1s_multipliers_are_folded_into_the_weights_they_scale_and_export_as_one(tmp_path, monkeypatch):
    """Falcon-H1's µP multipliers (every one of them not 1, no two alike) folded into the weights on import: logits,
    a left-padded batch, decoding and greedy ids equal transformers'; the gradients are the chain rule's — the folded
    weight ``m·W``'s gradient times ``m`` is transformers' gradient of ``W`` — and the export, all multipliers 1,
    loads in transformers with equal logits."""
    from recipes.hf import convert_weights, read_config
    from recipes.hf.architectures import FalconH1

    theirs, folder = falcon_h1(tmp_path, mamba_rms_norm=True, **FALCON_H1_MULTIPLIERS)
    ours = from_pretrained(folder).eval()
    ids, mask = left_padded_backward(ours, theirs)
    config = read_config(folder)
    ours_grads = FalconH1.fold(config, {name: p.grad for name, p in ours.named_parameters()})
    monkeypatch.delattr(FalconH1, "fold")  # theirs renamed alone
    theirs_grads = convert_weights(config, {name: p.grad for name, p in theirs.named_parameters()})
    monkeypatch.undo()
    for name, g in ours_grads.items():
        assert relative_error(g, theirs_grads[name]) <= GRADIENT_TOLERANCE, name
    decodes_as_transformers(ours, theirs, ids, mask)
    assert exports_to_transformers(ours, tmp_path / "exported") == "FalconH1ForCausalLM"
    exported = read_config(tmp_path / "exported")
    assert all(exported[k] == ([1.0] * len(v) if isinstance(v, list) else 1.0) for k, v in FALCON_H1_MULTIPLIERS.items())


def test_what_a_falcon_h1_config_says_is_read_as_transformers_reads_it_and_what_keeps_a_model_from_one():
    """Its defaults where a file is silent (an absent ``mamba_d_ssm`` is 1,024 channels, a null one ``mamba_expand ·
    hidden_size``; a null multiplier 1), a tied head with one multiplier for both, and refused by name: the fields the
    SSD cannot honour, a tied head with two, multipliers of the wrong count; then the zoo models that are not one."""
    from components import HybridLM
    from recipes.hf.architectures import FalconH1

    c = {"architectures": ["FalconH1ForCausalLM"], "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
         "num_hidden_layers": 2, "num_attention_heads": 8, "mamba_n_heads": 64, "mamba_d_state": 8}
    recipe = hf_recipe(c)
    attention, ssd = (m["init_args"] for m in recipe["mixers"]["P"]["init_args"]["mixers"])
    assert recipe["pattern"] == "PM×2" and (ssd["d_inner"], ssd["n_heads"], ssd["chunk_size"]) == (1024, 64, 256)
    assert (attention["n_kv_heads"], ssd["gate_rms_norm"], ssd["norm_before_gate"]) == (8, False, False)  # (num_key_value_heads 8)
    assert hf_recipe({**c, "mamba_d_ssm": None, "mamba_n_heads": 4})["mixers"]["P"]["init_args"]["mixers"][1][
        "init_args"]["d_inner"] == 32
    assert hf_recipe({**c, "embedding_multiplier": None, "mlp_multipliers": None})["pattern"] == "PM×2"
    assert hf_recipe({**c, "tie_word_embeddings": True, "embedding_multiplier": 2.0, "lm_head_multiplier": 2.0})[
        "tie_embeddings"]
    for fields, message in [
        ({"projectors_bias": True}, r"projectors_bias=True \(the zoo's SSD has no output bias\)"),
        ({"mamba_proj_bias": True}, r"mamba_proj_bias=True \(the zoo's conv has a bias, its projections none\)"),
        ({"time_step_limit": [0.0, 10.0]}, r"time_step_limit=\[0.0, 10.0\] \(the zoo does not clamp Δ\)"),
        ({"tie_word_embeddings": True, "lm_head_multiplier": 0.5},
         r"tie_word_embeddings with embedding_multiplier=1.0 ≠ lm_head_multiplier=0.5 \(one tied matrix takes one"),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' \(the zoo computes only 'silu'\)"),
        ({"mlp_multipliers": [1.0]}, r"mlp_multipliers=\[1.0\]: 2 multipliers expected"),
        ({"mamba_d_head": 32}, r"mamba_n_heads·mamba_d_head = 2048 != the Mamba-2 width 1024"),
        ({"attention_bias": True}, r"attention_bias=True \(the zoo computes only False\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            hf_recipe({**c, **fields})
    small = {**c, "num_attention_heads": 2, "num_key_value_heads": 1, "mamba_d_ssm": 32, "mamba_n_heads": 4, "mamba_chunk_size": 8, "mamba_rms_norm": True}
    model = HybridLM(**{k: v for k, v in hf_recipe(small).items() if k != "vocab_size"}, vocab_size=32)
    assert FalconH1.mismatch(model) is None
    model.blocks[1].sequence_mixer.mixers[1].gate_norm.eps = 1e-3
    assert FalconH1.mismatch(model).startswith("its SSDs' gate norms have another eps than its other norms")
    a, s = ({"class_path": "components.QCAttention", "init_args": {"n_heads": 2}},
            {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "conv": True, "rope": False,
                                                           "gate": True}})
    mlp = {"class_path": "components.MLP", "init_args": {"d_ff": 24}}
    swapped = HybridLM(32, 16, "PM", {"P": {"class_path": "components.ParallelMixers", "init_args": {"mixers": [s, a]}},
                                      "M": mlp})
    assert FalconH1.mismatch(swapped).startswith("its blocks are not all alike: a FalconH1ForCausalLM is ParallelMixers")
    roped = HybridLM(32, 16, "PM", {"P": {"class_path": "components.ParallelMixers", "init_args": {"mixers": [
        a, {**s, "init_args": {**s["init_args"], "rope": True}}]}}, "M": mlp})
    assert FalconH1.mismatch(roped) == "its SSDs are not all Mamba-2's (conv, D and the gate, no RoPE)"
    windowed = HybridLM(32, 16, "PM", {"P": {"class_path": "components.ParallelMixers", "init_args": {"mixers": [
        {**a, "init_args": {"n_heads": 2, "sliding_window": 4}}, s]}}, "M": mlp})
    assert FalconH1.mismatch(windowed).startswith("its attention is not Falcon-H1's")
    assert FalconH1.mismatch(HybridLM(32, 16, "AM", {"A": a, "M": mlp})).startswith("its blocks are not all alike")


@pytest.mark.parametrize("gate", [{"norm_before_gate": True}, {"gate_rms_norm": False}], ids=["norm first", "no norm"])
def test_an_ssd_whose_gate_is_falcon_h1s_is_refused_by_every_mamba2_class(gate):
    """Mamba-2, Granite, Bamba and Nemotron-H normalise the gated output; an SSD that normalises before the gate, or not
    at all (Falcon-H1's forms), would export as one of them computing something else, so each refuses it by name;
    Mamba-2's own gate passes."""
    from components import HybridLM
    from recipes.hf.architectures import Bamba, GraniteHybrid, Mamba2, NemotronH

    def ssd(**extra):
        return {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "conv": True, "rope": False,
                                                             "gate": True, "expand": 2, "norm_eps": 1e-5, **extra}}

    attention = {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}
    mlp = {"class_path": "components.MLP", "init_args": {"d_ff": 24}}
    plain = {"class_path": "components.MLP", "init_args": {"d_ff": 24, "activation": "plain", "act": "relu2"}}
    unroped = {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "rope": False}}
    for extra, says in (({}, None), (gate, "its SSDs' gates are not all Mamba-2's, which normalises the gated output")):
        models = {Mamba2: HybridLM(32, 16, "S-×2", {"S": ssd(**extra)}, norm_eps=1e-5),
                  GraniteHybrid: HybridLM(32, 16, "SM AM", {"S": ssd(**extra), "A": attention, "M": mlp}, norm_eps=1e-5),
                  Bamba: HybridLM(32, 16, "SM AM", {"S": ssd(**extra), "A": {**attention, "init_args": {
                      "n_heads": 2, "rope_fraction": 0.5}}, "M": mlp}, norm_eps=1e-5),
                  NemotronH: HybridLM(32, 16, "S- A- -M", {"S": ssd(**extra), "A": unroped, "M": plain}, norm_eps=1e-5)}
        for adapter, model in models.items():
            reason = adapter.mismatch(model)
            assert (reason is None) if says is None else reason.startswith(says), (adapter.name, reason)


def qwen3_next(tmp_path, **settings):
    """A tiny random Qwen3-Next (Gated DeltaNet with 2 key heads for 4 value heads, values 6 wide, and gated attention
    with heads of 8 over a width of 32, RoPE on a quarter of each head; a MoE of 4 experts, top 2, with a shared expert
    in layers 0, 1 and 3 and an MLP in layer 2), saved: transformers' model and its folder."""
    torch.manual_seed(0)
    config = transformers.Qwen3NextConfig(**{
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
        "linear_key_head_dim": 8, "linear_value_head_dim": 6, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24, "mlp_only_layers": [2], "rms_norm_eps": 1e-5,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"], **settings})
    return saved_random(transformers.Qwen3NextForCausalLM, config, tmp_path / "qwen3_next"), tmp_path / "qwen3_next"


def qwen3_next_files(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Qwen3-Next's gradients by its modules' names → by its files' (the experts one matrix each), each zero-centred
    norm's less 1: the import adds 1 to those gains, a constant that leaves their gradients as they are."""
    files = moe_files(tensors, "mlp", "gate_proj", "up_proj", "down_proj")
    zero_centred = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")
    final = ("model.norm.weight", "model.language_model.norm.weight")
    return {name: t - 1 if name.endswith(zero_centred) or name in final else t for name, t in files.items()}


@pytest.mark.parametrize("settings", [{}, {"num_experts": 0, "norm_topk_prob": False}, {"mlp_only_layers": [0, 1, 2, 3]}],
                         ids=["MoE and an MLP", "no experts", "every layer's MLP listed"])
def test_a_qwen3_next_imports_equal_to_transformers_and_exports_back(tmp_path, settings):
    """An independent check of Gated DeltaNet in a model, of gated attention and of the shared expert's sigmoid gate:
    Qwen3-Next (its norms' gains offsets from 1, its query map holding each head's gate) imports equal to transformers'
    — logits, a left-padded batch, every gradient, decoding one token at a time (its recurrent state and key cache
    against the zoo's) and greedy ids — and exports back to a folder transformers loads with equal logits, then imports
    again bit for bit."""
    theirs, folder = qwen3_next(tmp_path, **settings)
    ours = imports_equal_to_transformers(theirs, folder, as_files=qwen3_next_files)
    moe = settings == {}
    assert ours.pattern == ("GR AR GM AR" if moe else "GM AM GM AM")
    attention, rule = ours.blocks[1].sequence_mixer, ours.blocks[0].sequence_mixer
    assert (attention.gate_proj is not None, attention.positions.rope_fraction, attention.head_dim) == (True, 0.25, 8)
    assert (rule.n_heads, rule.n_k_heads, rule.head_dim, rule.v_head_dim) == (4, 2, 8, 6)
    # (without experts it is Qwen3.5's language model too, which the export takes first: asked for, Qwen3-Next's)
    assert exports_to_transformers(ours, tmp_path / "exported", as_class="Qwen3NextForCausalLM") == "Qwen3NextForCausalLM"
    again = read_config_of(tmp_path / "exported")
    assert again["layer_types"] == ["linear_attention", "full_attention"] * 2
    assert again["mlp_only_layers"] == ([2] if moe else [0, 1, 2, 3])


def read_config_of(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_what_a_qwen3_next_config_says_is_read_as_transformers_reads_it_and_what_keeps_a_model_from_one():
    """Layer kinds from ``full_attention_interval`` where ``layer_types`` is absent (every 4th attends by default),
    RoPE's share from either place it is written (0.25 by default; two that disagree refused), bad layer kinds named;
    and the export refuses, by name, a model it would write wrong."""
    from components import HybridLM
    from recipes.hf import export
    from recipes.hf.architectures import Qwen3Next

    c = {"architectures": ["Qwen3NextForCausalLM"], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 4,
         "num_attention_heads": 2, "head_dim": 8, "num_experts": 0, "linear_num_value_heads": 2,
         "linear_num_key_heads": 1, "linear_key_head_dim": 8, "linear_value_head_dim": 8, "intermediate_size": 24}
    recipe = hf_recipe(c)
    assert recipe["pattern"] == "GM GM GM AM"
    assert recipe["mixers"]["A"]["init_args"]["rope_fraction"] == 0.25
    assert hf_recipe({**c, "full_attention_interval": 2})["pattern"] == "GM AM GM AM"
    assert hf_recipe({**c, "partial_rotary_factor": 0.5})["mixers"]["A"]["init_args"]["rope_fraction"] == 0.5
    with pytest.raises(ValueError, match="fields that disagree on RoPE"):
        hf_recipe({**c, "partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                                         "partial_rotary_factor": 1.0}})
    with pytest.raises(ValueError, match=r"layer_types=\['linear_attention', 'sliding_attention'.*'full_attention', "):
        hf_recipe({**c, "layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]})
    with pytest.raises(ValueError, match="attention_bias=True"):
        hf_recipe({**c, "attention_bias": True})  # (its output map's bias too, which the zoo's has not)
    with pytest.raises(ValueError, match=r"hidden_act='gelu' \(Gated DeltaNet's convolution runs through it too"):
        hf_recipe({**c, "hidden_act": "gelu"})
    assert hf_recipe({**c, "hidden_act": "gelu", "full_attention_interval": 1})["pattern"] == "AM×4"  # (no such conv)

    mixers = {"G": {"class_path": "components.GatedDeltaNet", "init_args": {"n_heads": 2, "n_k_heads": 1, "head_dim": 8}},
              "A": {"class_path": "components.QCAttention",
                    "init_args": {"n_heads": 2, "qk_norm": True, "output_gate": True}}}
    model = HybridLM(32, 16, "GM AM", mixers)
    assert Qwen3Next.mismatch(model) is None
    gateless = HybridLM(32, 16, "GM AM", {**mixers, "A": {"class_path": "components.QCAttention",
                                                                "init_args": {"n_heads": 2, "qk_norm": True}}})
    assert Qwen3Next.mismatch(gateless).startswith("its attention is not Qwen3-Next's (an output gate")
    negative = HybridLM(32, 16, "GM AM", {**mixers, "G": {"class_path": "components.GatedDeltaNet",
                                          "init_args": {"n_heads": 2, "n_k_heads": 1, "allow_neg_eigval": True}}})
    assert Qwen3Next.mismatch(negative).startswith("its Gated DeltaNet is not Qwen3-Next's")
    assert Qwen3Next.mismatch(HybridLM(32, 16, "GM×2", mixers)).startswith("it has no attention block")
    gelu = HybridLM(32, 16, "GM AM", {**mixers, "M": {"class_path": "components.MLP", "init_args": {"act": "gelu"}}})
    assert Qwen3Next.mismatch(gelu).startswith("its MLPs use gelu beside Gated DeltaNet; Qwen3-Next's one hidden_act")
    llama_gated = HybridLM(32, 16, "AM×2", {"A": {"class_path": "components.QCAttention",
                                                  "init_args": {"n_heads": 2, "output_gate": True}}})
    with pytest.raises(ValueError, match=r"its attention gates its output \(output_gate\), which LlamaForCausalLM's "
                                         "does not"):
        export(llama_gated, "unused-folder")


def test_a_qwen3_5_language_model_imports_equal_to_transformers_and_exports_back(tmp_path):
    """Qwen3.5's language model (Qwen3-Next's layers with an MLP in each, Gated DeltaNet's input maps as four matrices,
    its multimodal RoPE's sections given): logits, a left-padded batch, every gradient, decoding one token at a time
    and greedy ids equal transformers'; the export loads in transformers with equal logits and imports again bit for
    bit; a MoE model is not one."""
    from components import HybridLM
    from recipes.hf.architectures import Qwen3_5

    torch.manual_seed(0)
    config = transformers.Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=6, rms_norm_eps=1e-5, layer_types=["linear_attention", "full_attention"] * 2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25,
                         "mrope_section": [1, 0, 0], "mrope_interleaved": True})
    theirs = saved_random(transformers.Qwen3_5ForCausalLM, config, tmp_path / "qwen3_5")
    ours = imports_equal_to_transformers(theirs, tmp_path / "qwen3_5", as_files=qwen3_next_files)
    assert ours.pattern == "GM AM GM AM"
    assert exports_to_transformers(ours, tmp_path / "exported") == "Qwen3_5ForCausalLM"
    assert not {"num_experts", "mlp_only_layers"} & set(read_config_of(tmp_path / "exported"))
    moe = HybridLM(32, 16, "GR AR", {
        "G": {"class_path": "components.GatedDeltaNet", "init_args": {"n_heads": 2, "n_k_heads": 1, "head_dim": 8}},
        "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "qk_norm": True, "output_gate": True}},
        "R": {"class_path": "components.ComposedMoE", "init_args": {
            "router": {"class_path": "components.TopKRouter", "init_args": {"n_experts": 2, "top_k": 1}},
            "experts": {"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 2, "d_ff": 8}},
            "shared_expert": {"class_path": "components.state.SigmoidGated",
                              "init_args": {"inner": {"class_path": "components.MLP", "init_args": {"d_ff": 8}}}}}}})
    assert Qwen3_5.mismatch(moe).startswith("it has MoE blocks; Qwen3.5's language model")
    from recipes.hf import export

    export(ours, tmp_path / "as-next", as_class="Qwen3NextForCausalLM")  # (a dense one is either; the default: 3.5)
    assert read_config_of(tmp_path / "as-next")["architectures"] == ["Qwen3NextForCausalLM"]
    with pytest.raises(ValueError, match=r"--as Qwen3_5ForCausalLM: this model \(pattern 'GR AR'\) is not one: it has MoE "
                                         "blocks"):
        export(moe, tmp_path / "moe", as_class="Qwen3_5ForCausalLM")
    with pytest.raises(ValueError, match=r"--as Qwen9ForCausalLM: not a class the export writes \(LlamaForCausalLM, "):
        export(moe, tmp_path / "moe", as_class="Qwen9ForCausalLM")
    export(moe, tmp_path / "moe")  # (with experts: Qwen3-Next's, the first that fits)
    assert read_config_of(tmp_path / "moe")["architectures"] == ["Qwen3NextForCausalLM"]


def test_qwen3_5_as_the_hub_holds_it_imports_its_language_model_equal_to_transformers(tmp_path):
    """A ``Qwen3_5ForConditionalGeneration`` folder (a vision tower beside the language model, the text settings in
    ``text_config``, the weights under ``model.language_model.``): its language model imports equal to transformers'
    model on text — logits, a left-padded batch, every gradient, decoding one token at a time, greedy ids — the vision
    tower left out; its text fields are audited; the export writes the language model alone."""
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, linear_num_value_heads=4, linear_num_key_heads=2,
                linear_key_head_dim=8, linear_value_head_dim=6, rms_norm_eps=1e-5,
                layer_types=["linear_attention", "full_attention"])
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32, patch_size=2,
                  temporal_patch_size=2, spatial_merge_size=1)
    torch.manual_seed(0)
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    theirs = saved_random(transformers.Qwen3_5ForConditionalGeneration, config, tmp_path / "qwen3_5_vl")
    theirs.config.vocab_size = 64  # (the helpers draw ids below it; this config keeps it in text_config)
    ours = imports_equal_to_transformers(theirs, tmp_path / "qwen3_5_vl", as_files=qwen3_next_files)
    assert ours.pattern == "GM AM" and not any("visual" in name for name in ours.state_dict())
    c = read_config_of(tmp_path / "qwen3_5_vl")
    with pytest.raises(ValueError, match=r"config.json's text_config: fields the zoo would not honour: num_experts=4"):
        hf_recipe({**c, "text_config": {**c["text_config"], "num_experts": 4}})
    with pytest.raises(ValueError, match="text_config=None: a Qwen3_5ForConditionalGeneration config holds"):
        hf_recipe({**c, "text_config": None})
    assert exports_to_transformers(ours, tmp_path / "exported") == "Qwen3_5ForCausalLM"


def test_a_qwen3_next_from_the_hub_keeps_its_multi_token_prediction_layers_out(tmp_path):
    """The hub's Qwen3-Next and Qwen3.5 files hold multi-token-prediction layers (``mtp.*``, ``mtp_num_hidden_layers``),
    which transformers drops on loading and never runs: the import leaves them out as well, and imports the same model."""
    from safetensors.torch import load_file, save_file

    _, folder = qwen3_next(tmp_path, num_experts=0)
    plain = from_pretrained(folder)
    weights = load_file(str(folder / "model.safetensors"))
    save_file({**weights, "mtp.fc.weight": torch.randn(32, 64), "mtp.layers.0.input_layernorm.weight": torch.randn(32)},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = read_config_of(folder)
    (folder / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1,
                                                    "mtp_use_dedicated_embeddings": False}))
    for (name, a), b in zip(plain.state_dict().items(), from_pretrained(folder).state_dict().values()):
        assert torch.equal(a, b), name


def olmo_hybrid(tmp_path, **settings):
    """A tiny random OLMo-Hybrid (Gated DeltaNet with 2 key heads for 4 value heads, values 6 wide, β in (0, 2), in
    layers 0, 1 and 3; attention with 4 heads, 2 of keys, behind norms after its mixers, in layer 2), saved:
    transformers' model and its folder."""
    torch.manual_seed(0)
    config = transformers.OlmoHybridConfig(**{
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
        "linear_value_head_dim": 6, "rms_norm_eps": 1e-5, "pad_token_id": 0, "eos_token_id": None,
        "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"], **settings})

    def spread(model):  # (decays and write strengths over their range, the output norms' gains away from 1)
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer, "linear_attn"):
                    layer.linear_attn.a_proj.weight.mul_(4.0)
                    layer.linear_attn.b_proj.weight.mul_(4.0)
                    layer.linear_attn.o_norm.weight.normal_(1.0, 0.3)

    return saved_random(transformers.OlmoHybridForCausalLM, config, tmp_path / "olmo_hybrid", spread), tmp_path / "olmo_hybrid"


@pytest.mark.parametrize("rope", [None, 500.0], ids=["no RoPE (the released models)", "RoPE"])
def test_an_olmo_hybrid_imports_equal_to_transformers_and_exports_back(tmp_path, rope):
    """An independent check of norms after the mixers beside norms before them in one model, of a QK-norm over every
    head, and of Gated DeltaNet with β in (0, 2): AI2's OLMo-Hybrid imports equal to transformers' — logits, a
    left-padded batch, every gradient, decoding one token at a time and greedy ids — and exports back to a folder
    transformers loads with equal logits, then imports again bit for bit."""
    theirs, folder = olmo_hybrid(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": rope})
    ours = imports_equal_to_transformers(theirs, folder)
    assert ours.pattern == "GM GM AM GM" and [b.post_norm for b in ours.blocks] == [False, False, True, False]
    attention, rule = ours.blocks[2].sequence_mixer, ours.blocks[0].sequence_mixer
    assert (attention.qk_norm_over, attention.positions.rope) == ("all_heads", rope is not None)
    assert (rule.n_heads, rule.n_k_heads, rule.head_dim, rule.v_head_dim, rule.allow_neg_eigval) == (4, 2, 8, 6, True)
    assert exports_to_transformers(ours, tmp_path / "exported") == "OlmoHybridForCausalLM"
    assert read_config_of(tmp_path / "exported")["rope_parameters"] == {"rope_type": "default", "rope_theta": rope}


def test_an_olmo2_imports_equal_to_transformers_and_exports_back(tmp_path):
    """OLMo 2: Llama's stack with its norms after the attention and the MLP and a QK-norm over each whole projection —
    logits, a left-padded batch, every gradient, decoding one token at a time, greedy ids; the export loads in
    transformers with equal logits and imports again bit for bit."""
    torch.manual_seed(0)
    config = transformers.Olmo2Config(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=None,
                                      rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    theirs = saved_random(transformers.Olmo2ForCausalLM, config, tmp_path / "olmo2")
    ours = imports_equal_to_transformers(theirs, tmp_path / "olmo2")
    assert ours.pattern == "AM×3" and all(b.post_norm for b in ours.blocks)
    assert ours.blocks[0].sequence_mixer.positions.k_norm.weight.shape == (16,)  # (2 key heads of 8)
    assert exports_to_transformers(ours, tmp_path / "exported") == "Olmo2ForCausalLM"


def test_what_an_olmo_hybrid_config_says_is_read_as_transformers_reads_it_and_what_keeps_a_model_from_one(tmp_path):
    """Layer kinds from ``layer_types`` or every 4th layer (the last where that gives none); the linear shapes from
    the width where the config is silent; no RoPE where ``rope_theta`` is null, either place; a model of one kind,
    another activation or a stretched RoPE refused by name; the hub's file names read; and the export refuses, by
    name, a model it would write wrong — and every other class refuses norms after the mixers and a QK-norm over every
    head."""
    from components import HybridLM
    from recipes.hf import export
    from recipes.hf.architectures import Olmo2, OlmoHybrid, to_zoo

    c = {"architectures": ["OlmoHybridForCausalLM"], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 3,
         "num_attention_heads": 2, "intermediate_size": 24, "rms_norm_eps": 1e-6}
    recipe = hf_recipe(c)
    assert recipe["pattern"] == "GM GM AM" and recipe["post_norm"] == ["AM"]  # (3 layers: no 4th, so the last)
    assert hf_recipe({**c, "num_hidden_layers": 8})["pattern"] == "GM GM GM AM GM GM GM AM"
    rule = recipe["mixers"]["G"]["init_args"]
    assert (rule["n_heads"], rule["n_k_heads"], rule["head_dim"], rule["v_head_dim"], rule["allow_neg_eigval"],
            rule["norm_eps"]) == (2, 2, 6, 12, True, 1e-5)  # (keys 0.75 · 16 / 2 wide, values twice that)
    assert "rope" not in recipe["mixers"]["A"]["init_args"]  # (no rope_theta said: transformers' 10,000)
    for nope in ({"rope_parameters": {"rope_type": "default", "rope_theta": None}}, {"rope_theta": None}):
        assert hf_recipe({**c, **nope})["mixers"]["A"]["init_args"]["rope"] is False
    with pytest.raises(ValueError, match="an OLMo-Hybrid has both 'linear_attention' and 'full_attention' layers"):
        hf_recipe({**c, "layer_types": ["full_attention"] * 3})
    with pytest.raises(ValueError, match=r"hidden_act='gelu' \(Gated DeltaNet's convolution runs through it too"):
        hf_recipe({**c, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match=r"rope_parameters=.*'dynamic'.* \(an OLMo-Hybrid's RoPE is plain"):
        hf_recipe({**c, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}})
    with pytest.raises(ValueError, match="lack 'model.layers.0.linear_attn.v_conv1d.weight', which a "
                                         "OlmoHybridForCausalLM whose files split the convolution in three has"):
        to_zoo(c, {"model.layers.0.linear_attn.q_conv1d.weight": torch.zeros(1),
                   "model.layers.0.linear_attn.k_conv1d.weight": torch.zeros(1)})

    mixers = {"G": {"class_path": "components.GatedDeltaNet", "init_args": {"n_heads": 2, "head_dim": 8, "norm_eps": 1e-5}},
              "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "qk_norm": True,
                                                                          "qk_norm_over": "all_heads"}}}
    model = HybridLM(32, 16, "GM AM", mixers, post_norm=["AM"])
    assert OlmoHybrid.mismatch(model) is None
    assert OlmoHybrid.mismatch(HybridLM(32, 16, "GM AM", mixers)).startswith(
        "its attention blocks do not all norm after their mixers, or its other blocks do")
    assert OlmoHybrid.mismatch(HybridLM(32, 16, "GM AM", mixers, post_norm=True)).startswith("its attention blocks do not")
    per_head = {**mixers, "A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "qk_norm": True}}}
    assert OlmoHybrid.mismatch(HybridLM(32, 16, "GM AM", per_head, post_norm=["AM"])).startswith(
        "its attention's QK-norm is not OLMo-Hybrid's (one RMSNorm over every head's channels")
    assert OlmoHybrid.mismatch(HybridLM(32, 16, "AM×2", mixers, post_norm=True)).startswith(
        "its blocks hold ['QCAttention/MLP']")
    other_eps = {**mixers, "G": {"class_path": "components.GatedDeltaNet", "init_args": {"n_heads": 2, "head_dim": 8}}}
    assert OlmoHybrid.mismatch(HybridLM(32, 16, "GM AM", other_eps, post_norm=["AM"])).startswith(
        "its Gated DeltaNet is not OLMo-Hybrid's (the output gate on, its norm's eps 1e-05)")
    stretched = HybridLM(32, 16, "GM AM", mixers, post_norm=["AM"], extrapolate=True)
    assert OlmoHybrid.mismatch(stretched).startswith("it stretches RoPE past its trained length")
    olmo2 = HybridLM(32, 16, "AM×2", {"A": mixers["A"]}, post_norm=True)
    assert Olmo2.mismatch(olmo2) is None
    assert Olmo2.mismatch(HybridLM(32, 16, "AM×2", {"A": mixers["A"]})).startswith("its blocks norm their mixers' inputs")
    with pytest.raises(ValueError, match=r"--as Qwen3ForCausalLM: this model \(pattern 'AM×2'\) is not one: its "
                                         r"attention's QK-norm spans every head \(qk_norm_over='all_heads'\), which "
                                         "Qwen3ForCausalLM's does not"):
        export(HybridLM(32, 16, "AM×2", {"A": mixers["A"]}), tmp_path / "wide", as_class="Qwen3ForCausalLM")
    plain = {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}}
    with pytest.raises(ValueError, match=r"as LlamaForCausalLM, its blocks put their norms after their mixers "
                                         r"\(post_norm\), which LlamaForCausalLM's do not"):
        export(HybridLM(32, 16, "AM×2", plain, post_norm=True), tmp_path / "post")


def test_an_olmo3_imports_equal_to_transformers_with_its_windowed_layers_and_exports_back(tmp_path):
    """OLMo 3: OLMo 2's layers, three in four attending to the last ``sliding_window`` keys — logits, a left-padded
    batch, every gradient, decoding one token at a time, greedy ids (the window, 5, shorter than the batch); the export
    loads in transformers with equal logits and imports again bit for bit. RoPE is read per layer kind as
    transformers reads it, and kinds that disagree are refused by name."""
    torch.manual_seed(0)
    rope = {"rope_type": "default", "rope_theta": 500.0}
    config = transformers.Olmo3Config(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=None,
                                      sliding_window=5, rope_parameters={"sliding_attention": rope, "full_attention": rope})
    theirs = saved_random(transformers.Olmo3ForCausalLM, config, tmp_path / "olmo3")
    ours = imports_equal_to_transformers(theirs, tmp_path / "olmo3")
    assert ours.pattern == "WM WM WM AM" and all(b.post_norm for b in ours.blocks)
    assert [b.sequence_mixer.sliding_window for b in ours.blocks] == [5, 5, 5, None] and ours.rotary.base == 500.0
    assert exports_to_transformers(ours, tmp_path / "exported") == "Olmo3ForCausalLM"

    c = {"architectures": ["Olmo3ForCausalLM"], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 4,
         "num_attention_heads": 2, "intermediate_size": 24}
    assert hf_recipe(c)["rope_base"] == 500000.0 and hf_recipe(c)["pattern"] == "WM WM WM AM"
    # (a flat rope_parameters is not read, as transformers does not: both kinds take the default)
    assert hf_recipe({**c, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})["rope_base"] == 500000.0
    assert hf_recipe({**c, "sliding_window": None})["pattern"] == "AM×4"
    with pytest.raises(ValueError, match=r"rope_parameters=\{'sliding_attention': .*500000.0.*'full_attention': .*"
                                         r"1000.0.* \(the zoo's attention layers share one plain RoPE"):
        hf_recipe({**c, "rope_theta": 1000.0})  # (transformers gives it to the full-attention layers only)
    with pytest.raises(ValueError, match=r"'rope_type': 'yarn'.*share one plain RoPE"):
        hf_recipe({**c, "rope_scaling": {"rope_type": "yarn", "factor": 8.0}})  # (the released models')
    assert hf_recipe({**c, "rope_theta": 1000.0, "layer_types": ["full_attention"] * 4})["rope_base"] == 1000.0


def test_an_olmo2_with_dynamic_ntk_runs_past_its_positions_as_transformers_and_exports_it(tmp_path):
    """OLMo 2's RoPE takes transformers' dynamic NTK stretch as Llama's does: imported, the zoo's model equals
    transformers' past ``max_position_embeddings``, and its export (``rope_scaling``) is read back so."""
    torch.manual_seed(0)
    config = transformers.Olmo2Config(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=16, pad_token_id=0,
                                      eos_token_id=None, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                          "rope_theta": 500.0})
    theirs = saved_random(transformers.Olmo2ForCausalLM, config, tmp_path / "olmo2")
    ours = from_pretrained(tmp_path / "olmo2").eval()
    assert ours.extrapolate and ours.rotary.scaling_factor == 2.0
    ids = torch.randint(0, 64, (1, 40))  # past max_position_embeddings = 16
    with torch.no_grad():
        assert relative_error(ours(ids), theirs(ids).logits) <= 1e-5
    from recipes.hf import export

    export(ours, tmp_path / "exported")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    with torch.no_grad():
        assert relative_error(ours(ids), again(ids).logits) <= 1e-5
