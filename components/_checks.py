"""Argument checks shared by the components: fail early, naming the argument, value and what is allowed."""


def check_choice(owner: str, name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{owner}: {name}={value!r} is not one of {tuple(allowed)}")


def check_positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}: {name}={value!r} must be a positive integer")


def check_divisible(owner: str, name: str, value: int, by_name: str, by: int) -> None:
    if value % by != 0:
        raise ValueError(f"{owner}: {name}={value} is not divisible by {by_name}={by}")
