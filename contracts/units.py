"""NNI's unit strings, converted where they are parsed (``nni/experiment/config/utils/public.py``)."""

from __future__ import annotations

import math
import re

_TIME = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_SIZE = {"tb": 1024.0**2, "gb": 1024.0, "mb": 1.0, "kb": 1 / 1024, "b": 1 / 1024**2}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_seconds(value: str | int | float) -> float:
    """``"1h"``, ``"30m"``, ``"1.5d"``, ``90`` → seconds. Numbers are seconds already."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '30m' or '2h', got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    match = _NUMBER_UNIT.match(value)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _TIME:
        raise ValueError(f"bad duration {value!r}: use a number with a unit d, h, m or s, e.g. '30m' or '2h'")
    return float(match.group(1)) * _TIME[unit]


def parse_seconds_setting(value: str | int | float) -> float:
    """A setting's duration: a plain number of seconds (``"600"``, as the environment gives
    it) or an NNI unit string (``"10m"``)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return parse_seconds(value)


def parse_megabytes(value: str | int | float) -> int:
    """``"8gb"``, ``"512mb"``, ``8192`` → MiB (rounded up), 1024-based as NNI does."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like '8gb', got {value!r}")
    if isinstance(value, int | float):
        return math.ceil(value)
    match = _NUMBER_UNIT.match(value)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE:
        raise ValueError(f"bad size {value!r}: use a number with a unit tb, gb, mb, kb or b, e.g. '8gb'")
    return math.ceil(float(match.group(1)) * _SIZE[unit])
