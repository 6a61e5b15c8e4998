import os
import signal
import sys


def run(argv: list[str]) -> None:
    """``python -m recipes [fit|validate|test|generate|eval] …``.

    torch and Lightning take seconds to import: a Ctrl+C then is one line and status 130, as anywhere before
    training. (An import cut short can fail in its own way — numpy's has raised RecursionError — so what ends the
    imports after a Ctrl+C is taken for the Ctrl+C; one that lands in a callback, importlib's cleanup of a module
    lock, Python ignores with a traceback: not printed.)"""
    interrupts = []

    def interrupted(signum, frame):
        interrupts.append(signum)
        raise KeyboardInterrupt

    def unraisable(info):  # the Ctrl+C raised inside a callback, which Python ignores and prints: it is seen above
        if not (interrupts and issubclass(info.exc_type, KeyboardInterrupt)):
            previous_hook(info)

    previous = signal.getsignal(signal.SIGINT)
    watching = previous is signal.default_int_handler  # (not where SIGINT is ignored, as in a background job)
    if watching:
        signal.signal(signal.SIGINT, interrupted)
        previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        if argv[:1] == ["generate"]:
            from recipes.generate import main as generate

            command = lambda: generate(argv[1:])  # noqa: E731
        elif argv[:1] == ["eval"]:
            from recipes.evaluation.cli import main as evaluate

            command = lambda: evaluate(argv[1:])  # noqa: E731
        else:
            from recipes.cli import main as command
    except BaseException:
        if not interrupts:
            raise
        print("interrupted (Ctrl+C) while starting: nothing was run", file=sys.stderr, flush=True)
        sys.exit(130)
    finally:
        if watching:
            signal.signal(signal.SIGINT, previous)
            sys.unraisablehook = previous_hook
    # A Ctrl+C that an import swallowed (a bare except around an optional import): the user still meant it.
    if interrupts:  # a Ctrl+C seen, whatever became of its KeyboardInterrupt
        print("interrupted (Ctrl+C) while starting: nothing was run", file=sys.stderr, flush=True)
        sys.exit(130)
    try:
        command()
    except KeyboardInterrupt:  # generate, eval (fit and the rest say their own): one line, not torch's traceback
        if os.environ.get("HYBRID_ZOO_DEBUG"):
            raise
        print(f"interrupted (Ctrl+C): {argv[0]} stopped; what it wrote before, it said above", file=sys.stderr,
              flush=True)
        sys.exit(130)


if __name__ == "__main__":
    run(sys.argv[1:])
