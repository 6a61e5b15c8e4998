"""Tokenizers that travel with a model: the recipe's own into an exported folder, a folder's into a recipe.

A byte-level recipe (``TextCorpus``: token = byte) is exported as a ``tokenizers`` BPE with no merges whose
vocabulary maps each byte's GPT-2 character to the byte's own value, so ``AutoTokenizer`` encodes a text to
exactly the ids the zoo trained on; a ``TokenizedCorpus`` recipe's ``tokenizer.json`` is copied as it is.
"""

import json
from pathlib import Path

END_OF_DOCUMENT = "<|endoftext|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map, which the byte-level pre-tokenizer applies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def byte_tokenizer(vocab_size: int = 256):
    """A ``tokenizers.Tokenizer`` whose ids are the text's UTF-8 bytes (ids past 255, if the model has them, are
    unused special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    extra = [f"<|unused_{i}|>" for i in range(256, vocab_size)]
    if extra:
        tokenizer.add_special_tokens(extra)
    return tokenizer


def write_tokenizer(data, out: Path, vocab_size: int) -> str:
    """The recipe's tokenizer into ``out`` (``tokenizer.json`` and ``tokenizer_config.json``); returns what it is."""
    out = Path(out)
    if hasattr(data, "write_tokenizer_file"):  # TokenizedCorpus: its own tokenizer file
        data.write_tokenizer_file(out / "tokenizer.json")
        file = getattr(data, "tokenizer_path", None)  # (a data module of one's own may write one without it)
        kind = f"the recipe's file {file}" if file else "the BPE trained on the corpus"
        eos, bos = data.end_of_document_token, getattr(data, "start_of_document_token", None)
    elif hasattr(data, "encode") and data.encode("é") == list("é".encode()):  # bytes
        byte_tokenizer(vocab_size).save(str(out / "tokenizer.json"))
        kind, eos, bos = "bytes", None, None
    else:
        raise ValueError(f"the recipe's data module {type(data).__name__} has no tokenizer to export (MQAR is not text)")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": 1_000_000_000_000}
    if eos:
        config.update(eos_token=eos, bos_token=bos or eos)  # (without its own, the end of one document opens the next)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return kind


def folder_tokenizer(folder: Path) -> Path | None:
    """The ``tokenizer.json`` a Hugging Face folder ships, if any."""
    path = Path(folder) / "tokenizer.json"
    return path if path.is_file() else None


def is_byte_tokenizer(tokenizer) -> bool:
    """Whether a ``tokenizers.Tokenizer`` maps text to its UTF-8 bytes (as an exported byte-level model's does)."""
    text = "a é\n€"
    return tokenizer.get_vocab_size() == 256 and tokenizer.encode(text, add_special_tokens=False).ids == list(text.encode())


def folder_special_token(folder: Path, tokenizer, kind: str) -> str | None:
    """The ``kind`` (``"eos"``: end, ``"bos"``: beginning) of sequence token of a Hugging Face folder
    (``tokenizer_config.json``'s ``{kind}_token`` when its ``tokenizers.Tokenizer`` has it, else ``config.json``'s
    ``{kind}_token_id``), or None."""
    settings = {}
    for name in ("tokenizer_config.json", "config.json"):
        try:
            settings[name] = json.loads((Path(folder) / name).read_text())
        except (OSError, ValueError):
            settings[name] = {}
    token = settings["tokenizer_config.json"].get(f"{kind}_token")
    token = token.get("content") if isinstance(token, dict) else token
    if not isinstance(token, str) or tokenizer.token_to_id(token) is None:
        ids = settings["config.json"].get(f"{kind}_token_id")
        ids = ids[0] if isinstance(ids, list) and ids else ids
        token = tokenizer.id_to_token(ids) if isinstance(ids, int) else None
    return token if isinstance(token, str) and tokenizer.token_to_id(token) is not None else None


def corpus_settings(folder: Path, tokenizer, vocab_size: int) -> dict:
    """The ``TokenizedCorpus`` arguments that fit a Hugging Face folder's model to its ``tokenizers.Tokenizer``: the
    model's end-of-sequence token ends documents (none is added to the vocabulary), its beginning-of-sequence token,
    where it has another, begins them (and prompts), and ``padded_vocab_size`` is the model's where its embedding is
    padded past the tokenizer. A ``ValueError`` when the model has no row for the tokenizer's tokens."""
    eos = folder_special_token(folder, tokenizer, "eos")
    bos = folder_special_token(folder, tokenizer, "bos")
    tokens = tokenizer.get_vocab_size() + (tokenizer.token_to_id(eos or END_OF_DOCUMENT) is None)
    if tokens > vocab_size:
        added = "" if eos or tokenizer.token_to_id(END_OF_DOCUMENT) is not None else (
            f" once {END_OF_DOCUMENT} is added to end documents (the folder names no end-of-sequence token it has)")
        raise ValueError(f"{folder}: the tokenizer has {tokens} tokens{added}, more than the model's {vocab_size} "
                         "embedding rows: fine-tuning would feed it ids it has no row for")
    settings = {"end_of_document_token": eos} if eos is not None and eos != END_OF_DOCUMENT else {}
    if bos is not None and bos != (eos or END_OF_DOCUMENT):
        settings["start_of_document_token"] = bos
    return {**settings, **({"padded_vocab_size": vocab_size} if vocab_size > tokens else {})}
