"""New experiment and trial ids: random, short, and not taken."""

from __future__ import annotations

import secrets
import string

#: An experiment id's alphabet (8 characters).
EXPERIMENT_ALPHABET = string.ascii_lowercase + string.digits
#: A trial id's alphabet (6 characters, the first a letter).
TRIAL_ALPHABET = string.ascii_letters + string.digits


def new_id(taken: dict, length: int, alphabet: str, first: str | None = None) -> str:
    """A random id of ``length`` characters from ``alphabet`` (the first from ``first``) not in ``taken``."""
    while True:
        head = secrets.choice(first or alphabet)
        candidate = head + "".join(secrets.choice(alphabet) for _ in range(length - 1))
        if candidate not in taken:
            return candidate
