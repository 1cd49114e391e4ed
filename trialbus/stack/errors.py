"""The one error ``trialbus up``, ``down`` and ``status`` end with: what happened and what to do."""

from __future__ import annotations


class StackError(RuntimeError):
    """The stack cannot start or a part of it died; ``log_tail`` shows why, if known."""

    def __init__(self, message: str, log_tail: str = "", exit_code: int = 1) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        #: What ``trialbus up`` exits with.
        self.exit_code = exit_code
