"""What to do when a part of the stack exits: compose's ``restart:`` policies, back-off, crash loops.

Pure logic, no processes: :class:`RestartPolicy` is one ``restart:`` value of compose.yaml;
:class:`Restarts` remembers one part's recent exits and answers how long to wait before
starting it again, or that it is in a crash loop and the stack must stop.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["no", "always", "on-failure", "unless-stopped"]


@dataclass(frozen=True)
class RestartPolicy:
    """Compose's ``restart:``: ``no`` (compose's default), ``always``, ``unless-stopped``,
    ``on-failure`` or ``on-failure:N`` (at most N restarts). Locally, ``always`` and
    ``unless-stopped`` are the same: a stop the user asked for is never undone."""

    mode: Mode = "no"
    #: ``on-failure:N``: restarts allowed in the stack's lifetime; None: no limit.
    max_restarts: int | None = None

    @classmethod
    def parse(cls, value: object) -> RestartPolicy:
        """A compose value (``"no"``, ``false``, ``"on-failure:3"``…); ValueError names what is accepted."""
        if value is None or value is False or value == "no":
            return cls("no")
        text = str(value).strip()
        mode, _, count = text.partition(":")
        if mode == "on-failure":
            if not count:
                return cls("on-failure")
            if count.isdigit():
                return cls("on-failure", int(count))
        elif mode in ("always", "unless-stopped") and not count:
            return cls(mode)  # type: ignore[arg-type]
        raise ValueError(f"restart: {text!r} is not one of no, always, unless-stopped, on-failure[:N]")

    def restarts(self, exit_code: int, restarted: int) -> bool:
        """Whether a part that exited with ``exit_code`` (negative: killed by that signal) after
        ``restarted`` restarts is started again."""
        if self.mode == "no":
            return False
        if self.mode == "on-failure":
            return exit_code != 0 and (self.max_restarts is None or restarted < self.max_restarts)
        return True

    def __str__(self) -> str:
        return f"on-failure:{self.max_restarts}" if self.max_restarts is not None else self.mode


@dataclass
class Restarts:
    """One part's recent exits. ``exited`` gives the back-off before the next start: ``backoff``
    seconds after the first exit in ``window`` seconds, doubling with every further one up to
    ``backoff_max``; at ``crash_loop`` exits within ``window`` it gives None: the part keeps
    dying. A part that stays up for ``window`` seconds starts again from the first delay."""

    backoff: float = 0.5
    backoff_max: float = 30.0
    crash_loop: int = 5
    window: float = 60.0
    #: Monotonic times of the exits within the window (at most ``crash_loop`` kept).
    exits: deque[float] = field(default_factory=deque)
    #: Restarts so far, in the stack's lifetime.
    count: int = 0

    def exited(self, now: float) -> float | None:
        self.exits.append(now)
        while self.exits and now - self.exits[0] > self.window:
            self.exits.popleft()
        recent = len(self.exits)
        if recent >= self.crash_loop:
            return None
        return min(self.backoff * 2 ** (recent - 1), self.backoff_max)

    def recent(self) -> int:
        return len(self.exits)
