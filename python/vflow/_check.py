"""Argument checks shared by the Python API and the `vflow` CLI: every int
that reaches the extension goes through `integer` first, so that a value
the C++ side cannot hold is a ValueError (or a TypeError for a value that
is not an int) naming the argument, never pybind11's "Unable to cast" or
"incompatible function arguments"; `finite` does the same for floats and
`path` for file names."""

from __future__ import annotations

import math
import numbers
import operator
import os
from typing import Any, List, Optional

# The C++ types ints land in.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
# Int params are carried as doubles: |value| <= 2^53 (runtime/Limits.h).
MAX_EXACT_INT = 2**53


def integer(name: str, value: Any, *, low: Optional[int] = 0,
            high: Optional[int] = INT32_MAX) -> int:
    """`value` as an int within [low, high] (None: no bound on that side;
    the default is a non-negative C++ int). An int-like value (numpy's
    ints) is accepted; a bool, a float or anything else is a TypeError; an
    int outside the range a ValueError naming `name` and the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        try:
            if isinstance(value, bool):
                raise TypeError
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{name}: expected an int, got "
                            f"{type(value).__name__} {value!r:.40}") from None
    value = int(value)
    if (low is not None and value < low) or (high is not None and
                                             value > high):
        raise ValueError(f"{name}: {value} is out of range ({_range(low, high)})")
    return value


def _range(low: Optional[int], high: Optional[int]) -> str:
    if low is None and high is None:
        return "any int"
    if high is None:
        return f"must be >= {low}"
    if low is None:
        return f"must be <= {high}"
    return f"must be between {low} and {high}"


def integers(name: str, values: Any, **bounds: Any) -> List[int]:
    """A list (or tuple, range, 1-D array) of ints, each checked as
    `integer` (the message names `name[i]`)."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values,
                                                             "__iter__"):
        raise TypeError(f"{name}: expected a list of ints, got "
                        f"{type(values).__name__}")
    return [integer(f"{name}[{i}]", v, **bounds)
            for i, v in enumerate(values)]


def finite(name: str, value: Any, *, low: Optional[float] = None,
           high: Optional[float] = None) -> float:
    """`value` as a finite float within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got "
                        f"{type(value).__name__} {value!r:.40}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: {value} is not a finite number")
    if (low is not None and value < low) or (high is not None and
                                             value > high):
        raise ValueError(f"{name}: {value} is out of range "
                         f"({_range(low, high)})")  # type: ignore[arg-type]
    return value


def path(name: str, value: Any) -> str:
    """A file name as text: str or os.PathLike, not empty, without a NUL
    byte (the operating system would read the name only up to it)."""
    try:
        text = os.fspath(value)
    except TypeError:
        raise TypeError(f"{name}: expected a path, got "
                        f"{type(value).__name__}") from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text:
        raise ValueError(f"{name}: the path is empty")
    if "\0" in text:
        raise ValueError(f"{name}: the path {text!r} holds a NUL byte; a file "
                         "name cannot contain one")
    return text
