"""``ZooLM``: a zoo model as an lm-evaluation-harness ``LM``, so any checkpoint of any pattern runs the
harness's tasks (``python -m recipes eval --tasks ...``; docs/evaluation.md).

It scores the way lm-eval's own Hugging Face model does — the same split of a context and its
continuation into tokens (trailing spaces move to the continuation), contexts longer than the model
cut from the left, the same rolling windows for perplexity, generation cut at the first stop string —
so its numbers are comparable with published ones, and it adds what the zoo's decoding cache allows:

- requests are batched longest first (right-padded: the models are causal, so padding after a
  sequence changes none of its logits);
- continuations that share a context (the choices of a multiple-choice question) are scored from one
  pass over the context: its cache is copied to each choice (``InferenceCache.expand``);
- generation runs a batch of requests at a time and ends it once every continuation holds a stop string.

This module imports ``lm_eval``: ``pip install -e ".[eval]"``.
"""

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm.auto import tqdm

from components.generation import left_padded
from recipes.evaluation.suites import score, score_shared
from recipes.generate import finished_text


class ZooLM(TemplateLM):
    """An lm-eval ``LM`` over a :class:`components.HybridLM` and a text tokenizer.

    Args:
        model: the ``HybridLM`` (``LanguageModel.model``); put in eval mode.
        tokenizer: an object with ``encode(text) -> list[int]`` and ``decode(ids) -> str`` (a recipe's
            data module: bytes for ``TextCorpus``, the BPE for ``TokenizedCorpus``).
        prefix_token: the token an empty context is replaced by (lm-eval uses the beginning-of-sequence token, or
            the end-of-text one); default: the tokenizer's ``start_of_document`` id if it has one (the end of
            document's, unless the corpus has a start token), else the newline's.
        batch_size: sequences per forward (default 8).
        max_length: the longest input (default the model's ``max_seq_len``); longer ones are cut from
            the left, as lm-eval's Hugging Face model does.
        reuse_context: score the choices of a shared context from one pass over it (default True).
        padding_side: ``right`` (default) or ``left`` (with a padding mask and positions from each
            sequence's first real token): both give the same scores.
        max_gen_toks: ``generate_until``'s default budget (default 256).
    """

    def __init__(self, model, tokenizer, *, prefix_token: int | None = None, batch_size: int = 8,
                 max_length: int | None = None, reuse_context: bool = True, padding_side: str = "right",
                 max_gen_toks: int = 256):
        super().__init__()
        if padding_side not in ("left", "right"):
            raise ValueError(f"ZooLM: padding_side={padding_side!r} is not 'left' or 'right'")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"ZooLM: batch_size={batch_size!r} must be a positive integer")
        self.model, self.tokenizer_ = model.eval(), tokenizer
        self.batch_size, self.reuse_context, self.padding_side = batch_size, reuse_context, padding_side
        self.max_length = max_length or model.max_seq_len
        self.max_gen_toks = max_gen_toks
        # requests scored or generated, and those of them cut from the left to max_length (the command says so:
        # a passkey cut off its key scores chance, and nothing else would tell)
        self.requests_seen, self.requests_cut = 0, 0
        end = getattr(tokenizer, "end_of_document", None)
        start = getattr(tokenizer, "start_of_document", end)
        if prefix_token is None:  # (lm-eval's: the beginning-of-sequence token if there is one, else the end of text)
            prefix_token = start if isinstance(start, int) else tokenizer.encode("\n")[0]
        self._prefix = prefix_token
        # the end-of-document token's text, which ends every generation as lm-eval's Hugging Face model adds its
        # end-of-text token to each task's stop strings (a byte tokenizer has none: its newline, the empty context,
        # is no end, and as a stop would cut every answer of several lines)
        self._end_text = tokenizer.decode([end]) if isinstance(end, int) else None
        # A corpus with a beginning-of-sequence token of its own (an imported Llama's <s>) begins every text with it,
        # as the model's Hugging Face tokenizer does, and lm-eval's Hugging Face model encodes with that tokenizer
        self._begin = [start] if isinstance(start, int) and start != end else []

    @property
    def device(self) -> torch.device:
        return self.model.embedding.weight.device

    @property
    def eot_token_id(self) -> int:
        return self._prefix

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self._begin + list(self.tokenizer_.encode(string))

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer_.decode(list(tokens))

    # ---- scoring -----------------------------------------------------------------------------------

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``(key, context tokens, continuation tokens)`` → ``(sum of log p(continuation), is it the greedy one)``."""
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        groups: dict[tuple[int, ...], list[int]] = {}
        plain = []
        for i, (key, context, continuation) in enumerate(requests):
            if key is not None:  # (a rolling window, key None, fits by construction)
                self.requests_seen += 1
                self.requests_cut += len(context) + len(continuation) > self.max_length + 1
            if not continuation:
                results[i] = (0.0, True)
            elif self.reuse_context and len(context) + len(continuation) <= self.max_length + 1 and context:
                groups.setdefault(tuple(context), []).append(i)
            else:
                plain.append(i)
        for context, members in list(groups.items()):
            if len(members) == 1:  # nothing to share
                plain += members
                del groups[context]
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="loglikelihood")
        shared = sorted(groups.items(), key=lambda group: -len(group[0]))  # contexts of similar length together
        for start in range(0, len(shared), self.batch_size):  # batch_size contexts, with all their choices
            chunk = shared[start:start + self.batch_size]
            scores = score_shared(self.model, [list(context) for context, _ in chunk],
                                  [[requests[i][2] for i in members] for _, members in chunk])
            for (_, members), group in zip(chunk, scores):
                for i, result in zip(members, group):
                    results[i] = result
                progress.update(len(members))
        plain.sort(key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))  # longest first
        for start in range(0, len(plain), self.batch_size):
            chunk = plain[start:start + self.batch_size]
            for i, result in zip(chunk, self._separate([requests[i][1] for i in chunk], [requests[i][2] for i in chunk])):
                results[i] = result
            progress.update(len(chunk))
        progress.close()
        for (key, _, _), result in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def _separate(self, contexts: list[list[int]], continuations: list[list[int]]) -> list[tuple[float, bool]]:
        """One forward over a batch of ``context + continuation`` inputs (cut from the left to ``max_length``)."""
        inputs = [(c + k)[-(self.max_length + 1):][:-1] for c, k in zip(contexts, continuations)]
        width = max(len(x) for x in inputs)
        ids = torch.zeros(len(inputs), width, dtype=torch.long, device=self.device)
        padding = torch.zeros(len(inputs), width, dtype=torch.bool, device=self.device)
        for row, x in enumerate(inputs):
            if self.padding_side == "right":
                ids[row, :len(x)] = torch.tensor(x)
            else:
                ids[row, width - len(x):] = torch.tensor(x)
                padding[row, :width - len(x)] = True
        if self.padding_side == "right":
            logits = self.model(ids)  # [b, width, V]: causal, so the right padding changes nothing before it
        else:
            positions = (~padding).long().cumsum(dim=1).sub(1).clamp_min(0)  # [b, width]
            logits = self.model(ids, position_ids=positions, padding_mask=padding)
        out = []
        for row, (x, continuation) in enumerate(zip(inputs, continuations)):
            end = len(x) if self.padding_side == "right" else width
            out.append(score(logits[row, end - len(continuation):end], continuation))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text, in lm-eval's disjoint rolling windows of ``max_length``."""
        out = []
        for request in tqdm(requests, disable=disable_tqdm, desc="loglikelihood_rolling"):
            (text,) = request.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            scores = self._loglikelihood_tokens([(None, context, target) for context, target in windows],
                                                disable_tqdm=True)
            total = sum(score for score, _ in scores)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    # ---- generation --------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with ``do_sample``, a ``temperature`` and optionally ``top_k`` and ``top_p``)
        continuation of each context, from the zoo's cache, cut at the first of the ``until`` strings (and, as
        lm-eval's Hugging Face model does, at the end-of-document token's text where the tokenizer has one). A
        setting the zoo's ``generate`` does not have (beam search, a repetition penalty) is refused by name, not ignored.

        Up to ``batch_size`` requests of the same budget and sampling are generated together, longest context
        first (left-padded, with positions from each one's first real token), and generation ends once each of them
        has met one of its stop strings or its budget: a short answer costs a few steps, not ``max_gen_toks``
        (lm-eval's default 256), as lm-eval's own Hugging Face model stops."""
        jobs = []  # (prompt tokens, stop strings, budget, (temperature, top_k, top_p))
        for request in requests:
            context, kwargs = request.args
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            if self._end_text is not None and self._end_text not in until:  # (a continuation past it is the next document)
                until.append(self._end_text)
            until = until or [self.tok_decode([self.eot_token_id])]
            budget = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            if budget > self.max_length and not self.model.extrapolate:  # (no context fits beside it)
                raise ValueError(f"generate_until: a budget of {budget} new tokens (max_gen_toks) is more than the "
                                 f"model's max_seq_len={self.max_length} takes after any context; give a smaller one "
                                 "(the eval command's --gen_kwargs max_gen_toks=N)")
            tokens = self.tok_encode(context) or [self.prefix_token_id]
            self.requests_seen += 1
            self.requests_cut += len(tokens) > max(self.max_length - budget, 1)
            jobs.append((tokens[-max(self.max_length - budget, 1):],
                         until, budget, sampling(kwargs)))  # (the context cut from the left, as lm-eval's HF model does)
        order = sorted(range(len(jobs)), key=lambda i: (repr(jobs[i][3]), jobs[i][2], -len(jobs[i][0])))
        out: list[str | None] = [None] * len(jobs)
        progress = tqdm(total=len(jobs), disable=disable_tqdm, desc="generate_until")
        start = 0
        while start < len(order):
            kind = jobs[order[start]][2:]  # (budget, sampling): a batch shares them
            chunk = [i for i in order[start:start + self.batch_size] if jobs[i][2:] == kind]  # (contiguous: sorted)
            texts = self.generate_texts([jobs[i][0] for i in chunk], [jobs[i][1] for i in chunk], kind[0], *kind[1])
            for i, text in zip(chunk, texts):
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
            progress.update(len(chunk))
            start += len(chunk)
        progress.close()
        return out

    @torch.no_grad()
    def generate_texts(self, prompts: list[list[int]], untils: list[list[str]], max_new_tokens: int,
                       temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None) -> list[str]:
        """``model.generate`` from each prompt (token lists, left-padded into one batch), each continuation decoded
        and cut at the first of its stop strings; generation ends once every continuation holds one."""
        width = max(len(p) for p in prompts)
        ids, padding = left_padded(prompts, self.device)  # [b, width], [b, width]
        ended = [False] * len(prompts)

        def stopped(new: torch.Tensor) -> torch.Tensor:  # [b, n] -> [b]
            for row, stops in enumerate(untils):
                if not ended[row]:
                    text = finished_text(self.tok_decode(new[row].tolist()))
                    ended[row] = any(stop and stop in text for stop in stops)
            return torch.tensor(ended)

        tokens = self.model.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                     padding_mask=padding if bool(padding.any()) else None, stop_when=stopped)
        texts = []
        for row, stops in enumerate(untils):
            text = self.tok_decode(tokens[row, width:].tolist())
            for stop in stops:
                if stop:
                    text = text.split(stop)[0]
            texts.append(text)
        return texts


NO_OPS = {"num_beams": 1, "num_return_sequences": 1, "repetition_penalty": 1.0}
"""Generation settings a task may name at values that change nothing: accepted, where any other value is refused."""


def sampling(kwargs: dict) -> tuple[float, int | None, float | None]:
    """``(temperature, top_k, top_p)`` from a request's remaining generation settings: greedy ``(0.0, None, None)``
    unless ``do_sample`` with a temperature above 0 (Hugging Face's rule: without ``do_sample`` the others are not
    used). A setting left over, unknown to the zoo's ``generate`` and not a no-op, is refused by name: ignored, it
    would have scored another decoding than the task's."""
    sample = bool(kwargs.pop("do_sample", False))
    temperature = float(kwargs.pop("temperature", 0.0))
    top_k, top_p = kwargs.pop("top_k", None), kwargs.pop("top_p", None)
    unknown = {key: value for key, value in kwargs.items() if NO_OPS.get(key, object()) != value}
    if unknown:
        raise ValueError(f"generate_until: the task asks for {', '.join(f'{k}={v!r}' for k, v in unknown.items())}, "
                         "which the zoo's generate does not do (it takes until, max_gen_toks, do_sample, temperature, "
                         "top_k and top_p)")
    if not sample or temperature == 0:
        return 0.0, None, None
    return temperature, None if top_k is None else int(top_k), None if top_p is None else float(top_p)
