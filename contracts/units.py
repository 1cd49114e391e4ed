"""NNI's unit strings, converted where they are parsed (``nni/experiment/config/utils/public.py``)."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_TIME = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_SIZE = {"tb": 1024.0**2, "gb": 1024.0, "mb": 1.0, "kb": 1 / 1024, "b": 1 / 1024**2}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
#: The longest duration: what a ``timedelta`` holds (999999999 days), so every deadline can be computed.
MAX_SECONDS = timedelta.max.total_seconds()


def parse_seconds(value: str | int | float) -> float:
    """``"1h"``, ``"30m"``, ``"1.5d"``, ``90`` → seconds. Numbers are seconds already.

    ValueError (never another error: this runs inside validators) for anything else, and for a
    duration that is not finite or longer than :data:`MAX_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a duration like '30m' or '2h', got {value!r}")
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _TIME:
            raise ValueError(f"bad duration {value!r}: use a number with a unit d, h, m or s, e.g. '30m' or '2h'")
        value = float(match.group(1)) * _TIME[unit]
    if value != value or abs(value) > MAX_SECONDS:  # NaN; compared before float(), so a huge int cannot overflow
        raise ValueError(f"duration {value!r:.40} is out of range: at most {MAX_SECONDS:.0f} seconds (999999999 days)")
    return float(value)


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
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return math.ceil(value)
    match = _NUMBER_UNIT.match(value) if isinstance(value, str) else None
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE:
        raise ValueError(f"bad size {value!r}: use a number with a unit tb, gb, mb, kb or b, e.g. '8gb'")
    megabytes = float(match.group(1)) * _SIZE[unit]
    if not math.isfinite(megabytes):
        raise ValueError(f"size {value!r:.40} is out of range")
    return math.ceil(megabytes)
