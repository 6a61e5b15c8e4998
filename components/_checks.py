"""Argument checks shared by the components: fail early, naming the argument, value and what is allowed."""


def check_choice(owner: str, name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{owner}: {name}={value!r} is not one of {tuple(allowed)}")


def check_positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}: {name}={value!r} must be a positive integer")


def check_flags(owner: str, **flags) -> None:
    """Each flag a real ``bool``: ``rope="false"`` or ``normalize="no"`` would otherwise be truthy and switch the
    option on without a word."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{owner}: {name}={value!r} must be True or False")


def check_number(owner: str, name: str, value, *, low: float, above: bool = False, optional: bool = False) -> None:
    """A real, finite ``value >= low`` (``> low`` when ``above``; ``None`` too when ``optional``): a negative norm
    epsilon or a zero RoPE base gives NaN only at the first forward, and that without a name."""
    import math

    if value is None and optional:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < low or (above and value == low)):
        bound = f" {'>' if above else '>='} {low:g}" if math.isfinite(low) else ""
        rule = f"a finite number{bound}" + (" (or None)" if optional else "")
        raise ValueError(f"{owner}: {name}={value!r} must be {rule}")


def check_divisible(owner: str, name: str, value: int, by_name: str, by: int) -> None:
    if value % by != 0:
        raise ValueError(f"{owner}: {name}={value} is not divisible by {by_name}={by}")


def check_mixer_input(owner: str, x, d_model: int, weight, *, sequence: bool) -> None:
    """A mixer's input: a floating tensor ``[B, T, d_model]`` (sequence mixers) or ``[..., d_model]``
    (state mixers), in the parameters' dtype unless autocast decides the dtypes."""
    import torch

    from zoo_kernels._backend import autocast_dtype

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{owner}: the input must be a tensor; got {type(x).__name__}")
    shape = "[B, T, d_model]" if sequence else "[..., d_model]"
    if (x.dim() != 3 if sequence else x.dim() < 1) or x.shape[-1] != d_model:
        raise ValueError(f"{owner}: the input must be {shape} with d_model={d_model}; got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{owner}: the input must be a floating-point tensor; got {x.dtype}")
    if x.dtype != weight.dtype and autocast_dtype(x.device.type) is None:
        raise ValueError(
            f"{owner}: the input is {x.dtype} but the parameters are {weight.dtype}; convert one of them "
            "(module.to(dtype)) or run under torch.autocast"
        )


def check_on_device(ok, static_message: str, message=None, *, sync: bool) -> None:
    """Fail unless the bool scalar tensor ``ok`` is True.

    With ``sync`` (eval, eager): one host sync, then a ``ValueError`` with ``message()`` (a callable,
    so the values it names are read only on failure) or ``static_message``. Without (training mode,
    or while ``torch.compile`` traces): ``torch._assert_async`` with ``static_message``, which never
    waits for the device, so a training step stays free of host syncs (CUDA graphs, fullgraph
    compilation); on CPU it raises a ``RuntimeError`` at once, on CUDA a device-side assert.
    """
    import torch

    if sync and not torch.compiler.is_compiling():
        if not bool(ok):
            raise ValueError(message() if message is not None else static_message)
        return
    torch._assert_async(ok, static_message)
