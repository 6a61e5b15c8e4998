"""CPU benchmark of the state mixers: forward+backward throughput at equal total parameters, and
CDMoE's cost as its number of experts grows.

    python -m recipes.benchmarks.state_mixers                    # d_model 256, 8×512 tokens
    python -m recipes.benchmarks.state_mixers --repeats 3 --tokens 2048

Table 1 sizes every mixer to the same total parameters as a 4-expert routed MoE at the dense MLP's
width (each mixer's ``d_ff`` solved with :func:`components.sizing.solve_width`) and reports total and
active parameters, the median forward+backward time and tokens per second, and the time relative
to the dense MLP of the same total size (measured in the same run).

Table 2 holds CDMoE's heads, top-k and widths fixed and grows ``n_experts`` 1k → 4k → 16k → 65k;
Wonderful Matrices v1/002 claim the retrieval cost grows with √N. The target is time(65k) / time(1k) ≤ 3.
"""

import argparse

import torch

from components.state import MLP, CDMoE, CohesiveMoE, ExpansiveMoE, RoutedMoE, SharedExpertMoE
from components.state.mlp import default_d_ff
from components.sizing import solve_width
from recipes.argtypes import positive_int
from recipes.benchmarks.timing import median_ms


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def active(module: torch.nn.Module) -> int:
    return module.active_parameters() if hasattr(module, "active_parameters") else n_params(module)


def fwd_bwd_ms(module: torch.nn.Module, x: torch.Tensor, repeats: int) -> float:
    def step():
        module.zero_grad(set_to_none=True)
        module(x).sum().backward()
    return median_ms(step, repeats)


def mixers(d_model: int) -> dict:
    """Name → factory taking the width being solved (``d_ff``)."""
    return {
        "MLP (dense)": lambda w: MLP(d_model, d_ff=w),
        "RoutedMoE 4×top-2": lambda w: RoutedMoE(d_model, n_experts=4, top_k=2, d_ff=w),
        "SharedExpertMoE 1+3×top-1": lambda w: SharedExpertMoE(d_model, n_experts=3, top_k=1, n_shared=1, d_ff=w),
        "CohesiveMoE 4×top-2": lambda w: CohesiveMoE(d_model, n_experts=4, top_k=2, d_ff=w),
        "ExpansiveMoE 4×top-2": lambda w: ExpansiveMoE(d_model, n_experts=4, top_k=2, d_ff=w, d_shared=d_model),
        "CDMoE 1024, 4 heads×top-8": lambda w: CDMoE(d_model, n_experts=1024, n_heads=4, top_k=8, d_ff=w),
    }


def equal_parameter_mixers(d_model: int) -> tuple[int, dict[str, tuple[int, torch.nn.Module]]]:
    """The target — a 4-expert top-2 RoutedMoE's total parameters at the dense MLP's width — and every mixer
    sized to it: name → (its ``d_ff``, the module). Raises ``ValueError`` naming a mixer that even at its
    narrowest has more parameters than the target at this ``d_model`` (CDMoE's 1,024 experts below 96)."""
    target = n_params(RoutedMoE(d_model, n_experts=4, top_k=2, d_ff=default_d_ff(d_model, "swiglu")))
    sized = {}
    for name, build in mixers(d_model).items():
        torch.manual_seed(0)
        try:
            width = solve_width(lambda w: n_params(build(w)), target, multiple_of=8)
        except ValueError as error:
            raise ValueError(f"--d-model {d_model}: {name} cannot match the 4-expert MoE's parameters ({error}); "
                             "take a wider --d-model") from None
        sized[name] = width, build(width)
    return target, sized


def equal_parameter_table(d_model: int, target: int, sized: dict[str, tuple[int, torch.nn.Module]], tokens: int,
                          repeats: int) -> str:
    """Table 1 over ``equal_parameter_mixers``' modules; times relative to the first (the dense MLP)."""
    x = torch.randn(1, tokens, d_model, requires_grad=True)
    rows, baseline = [], None
    for name, (width, module) in sized.items():
        ms = fwd_bwd_ms(module, x, repeats)
        baseline = baseline or ms
        rows.append(f"| {name} | {width} | {n_params(module):,} | {active(module):,} | {ms:.1f} | "
                    f"{tokens / ms * 1e3:,.0f} | {ms / baseline:.2f} |")
    head = (f"Equal total parameters (target {target:,}, d_model {d_model}, {tokens} tokens), forward+backward, "
            f"median of {repeats}:\n\n| mixer | d_ff | total | active/token | ms | tokens/s | time vs MLP |\n"
            "|---|---|---|---|---|---|---|")
    return "\n".join([head, *rows])


def scaling_cdmoe(d_model: int, n_experts: int) -> CDMoE:
    """Table 2's CDMoE: heads, top-k and width fixed, ``n_experts`` growing."""
    return CDMoE(d_model, n_experts=n_experts, n_heads=4, top_k=16, d_ff=2 * d_model)


def check_scaling_sizes(d_model: int, sizes: list[int]) -> None:
    """Build table 2's CDMoEs on the meta device (no memory, no time), so that a size CDMoE refuses (not a
    perfect square, fewer than 16 keys a half) is refused before table 1's minutes, not after."""
    with torch.device("meta"):
        for n in sizes:
            try:
                scaling_cdmoe(d_model, n)
            except ValueError as error:
                raise ValueError(f"--experts {n}: {error}") from None


def cdmoe_scaling_table(d_model: int, tokens: int, repeats: int, sizes: list[int]) -> str:
    x = torch.randn(1, tokens, d_model, requires_grad=True)
    rows, first = [], None
    for n in sizes:
        torch.manual_seed(0)
        module = scaling_cdmoe(d_model, n)
        ms = fwd_bwd_ms(module, x, repeats)
        first = first or ms
        rows.append(f"| {n:,} | {module.n_keys} | {n_params(module):,} | {active(module):,} | {ms:.1f} | {ms / first:.2f} |")
    head = (f"CDMoE as n_experts grows (d_model {d_model}, d_ff {2 * d_model}, 4 heads × top-16, {tokens} tokens), "
            f"forward+backward, median of {repeats}:\n\n| n_experts | n_keys | total | active/token | ms | "
            f"time / time({sizes[0]:,}) |\n|---|---|---|---|---|---|")
    return "\n".join([head, *rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.state_mixers",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=positive_int, default=256)
    parser.add_argument("--tokens", type=positive_int, default=4096)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--experts", type=positive_int, nargs="+", default=[1024, 4096, 16384, 65536])
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    try:  # every size is checked before anything is timed
        target, sized = equal_parameter_mixers(args.d_model)
        check_scaling_sizes(args.d_model, args.experts)
    except ValueError as error:
        parser.error(str(error))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(equal_parameter_table(args.d_model, target, sized, args.tokens, args.repeats), "\n")
    print(cdmoe_scaling_table(args.d_model, args.tokens, args.repeats, args.experts))


if __name__ == "__main__":
    main()
