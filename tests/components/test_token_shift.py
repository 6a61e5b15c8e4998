"""``TokenShift`` against its formula written out: ``y_t = W_out (x_t + μ ⊙ (x_{t−1} − x_t))``, with ``x_{−1}``, the
position before a document start and a padded position all reading 0. (The catalogue's contract tests compare the
mixer with itself — prefill against steps, a packed row against its documents — so a wrong ``x_{−1}`` or a sign
would pass them.)"""

import torch

from components import TokenShift
from components.context import Context


def shifted(x: torch.Tensor, mix: torch.Tensor, weight: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    return (x + mix * (previous - x)) @ weight.T


def mixer(d: int = 6) -> TokenShift:
    torch.manual_seed(0)
    module = TokenShift(d)
    with torch.no_grad():
        module.mix.uniform_(-1, 2)  # per channel, not the default 0.5 everywhere
    return module


def test_each_position_mixes_with_the_one_before_and_the_first_with_zero():
    module = mixer()
    x = torch.randn(2, 7, 6)
    previous = torch.cat([torch.zeros(2, 1, 6), x[:, :-1]], dim=1)  # [B, T, d]
    torch.testing.assert_close(module(x), shifted(x, module.mix, module.out_proj.weight, previous))


def test_the_position_at_a_document_start_reads_zero():
    module = mixer()
    x = torch.randn(1, 7, 6)
    ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2]])
    context = Context(position_ids=torch.arange(7)[None], document_ids=ids)
    previous = torch.cat([torch.zeros(1, 1, 6), x[:, :-1]], dim=1)
    previous[:, [3, 5]] = 0.0
    torch.testing.assert_close(module(x, context), shifted(x, module.mix, module.out_proj.weight, previous))


def test_a_padded_position_passes_zero_on_whatever_it_held():
    module = mixer()
    x = torch.randn(1, 5, 6)
    x[0, 0] = float("nan")  # left padding
    x[0, 3] = 1e4
    pad = torch.tensor([[True, False, False, True, False]])
    y = module(x, Context(position_ids=torch.arange(5)[None], padding_mask=pad))
    clean = x.masked_fill(pad[..., None], 0.0)
    previous = torch.cat([torch.zeros(1, 1, 6), clean[:, :-1]], dim=1)
    want = shifted(clean, module.mix, module.out_proj.weight, previous)
    torch.testing.assert_close(y[:, [1, 2, 4]], want[:, [1, 2, 4]])


def test_decoding_keeps_the_last_input_and_an_empty_call_keeps_it_too():
    from components.cache import InferenceCache

    module = mixer()
    x = torch.randn(2, 6, 6)
    cache = InferenceCache(2, 6)
    outputs = []
    for start, stop in ((0, 3), (3, 3), (3, 4), (4, 4), (4, 6)):  # a prompt, then steps with empty calls between
        context = Context(position_ids=torch.arange(start, stop).expand(2, -1), cache=cache)
        outputs.append(module(x[:, start:stop], context))
        cache.end(stop - start)
    torch.testing.assert_close(torch.cat(outputs, dim=1), module(x))
