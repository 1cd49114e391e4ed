"""Why trials failed, a line each, for the commands that show an experiment (``experiment run``,
``top``): the trial, its exit code, its last stderr line (``TrialState.last_error``, where its
platform could read it) and the command that prints its whole log.

The line is the trial's own output: it is escaped (rich markup), never interpreted. Loaded only
when one of those commands runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape

if TYPE_CHECKING:
    from contracts import TrialState
    from trialbus.api import ExperimentView
    from trialbus.client import AsyncClient

#: How many failures a summary shows (the first ones: later ones are often the same).
SHOWN = 3


def first_failures(trials: list[TrialState], limit: int = SHOWN) -> list[TrialState]:
    """The first FAILED trials to end, one per distinct last stderr line, at most ``limit``."""
    from contracts import TrialStatus

    def ended(t: TrialState) -> tuple:
        return t.end_time is None, t.end_time, t.sequence_id

    failed = [t for t in trials if t.status == TrialStatus.FAILED]
    if limit == 1:  # the live view, at every look: no sort
        return [min(failed, key=ended)] if failed else []
    failed.sort(key=ended)
    shown: dict[str | None, TrialState] = {}
    for trial in failed:
        shown.setdefault(trial.last_error, trial)
        if len(shown) == limit:
            break
    return list(shown.values())


def failure_line(trial: TrialState) -> str:
    """``trial abc12 failed (exit 1): ModuleNotFoundError: …; whole log: `trialbus log trial abc12```
    (rich markup, the trial's output escaped)."""
    return said(trial.id, trial.exit_code, trial.last_error or trial.message)


def said(trial_id: str, exit_code: int | None, why: str | None) -> str:
    """:func:`failure_line` from its parts (a FAILED event's, in ``trialbus watch``)."""
    code = f" (exit {exit_code})" if exit_code is not None else ""
    return (
        f"[red]trial {trial_id} failed{code}:[/] {escape(why or 'no reason recorded')}; whole log: "
        f"[bold]trialbus log trial {trial_id}[/]"
    )


async def first_failure(client: AsyncClient, experiment_id: str) -> TrialState | None:
    """The experiment's first FAILED trial (by trial number): one page of one trial."""
    from contracts import TrialStatus

    page = await client.trial_page(experiment_id, limit=1, status=TrialStatus.FAILED, sort="sequence")
    return page.trials[0] if page.trials else None


async def why_lines(client: AsyncClient, experiment: ExperimentView) -> list[str]:
    """What ``top`` says under an experiment's row: why it was stopped (its message), and, while none
    of its trials succeeded, its first failure (:func:`failure_line`): one small page at most."""
    lines = [f"{experiment.id}: [yellow]{escape(experiment.message)}[/]"] if experiment.message else []
    counts = experiment.trial_counts
    if counts.get("FAILED") and not counts.get("SUCCEEDED") and (first := await first_failure(client, experiment.id)):
        lines.append(f"{experiment.id}: {failure_line(first)}")
    return lines
