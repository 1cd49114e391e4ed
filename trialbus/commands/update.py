"""``trialbus update concurrency|trialnum|duration|searchspace``: change a running experiment, as ``nnictl update``.

Both spellings work: ours, ``trialbus update concurrency ID 4``, and nnictl's, ``trialbus update concurrency ID
--value 4`` (``searchspace ID -f space.json``, nnictl's ``--filename``); the ID may be left out while one
experiment runs. The dispatcher and the tuner service act on the change at once; the command prints what changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trialbus.commands.common import console, the_experiment, with_client
from trialbus.output import fail

if TYPE_CHECKING:  # loaded when a command runs, not with the CLI (trialbus.cli)
    from trialbus.api import ExperimentUpdate
    from trialbus.client import AsyncClient

app = typer.Typer(
    help="Change a running experiment: concurrency, trialnum, duration, searchspace (nnictl update).",
    no_args_is_help=True,
)

First = Annotated[
    str | None,
    typer.Argument(metavar="[ID]", show_default=False, help="The experiment (left out: the one running)."),
]
Second = Annotated[str | None, typer.Argument(metavar="[VALUE]", show_default=False, help="The new value.")]
Value = Annotated[str | None, typer.Option("--value", "-v", help="The new value (nnictl's spelling).")]


def _id_and_value(first: str | None, second: str | None, value: str | None) -> tuple[str | None, str]:
    """``ID VALUE``, ``VALUE`` alone (the one running experiment), or ``[ID] --value VALUE``."""
    if value is not None:
        if second is not None:
            raise fail("give the new value once: as VALUE or as --value")
        return first, value
    if second is not None:
        return first, second
    if first is not None:
        return None, first
    raise fail("give the new value, e.g. `trialbus update concurrency ID 4` (or --value 4)")


def _whole(text: str, what: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise fail(f"{what} must be a whole number above 0, got {text!r}") from None
    if number <= 0:
        raise fail(f"{what} must be a whole number above 0, got {number}")
    return number


def _apply(ctx: typer.Context, given: str | None, changes: dict[str, Any]) -> None:
    async def work(client: AsyncClient) -> tuple[str, ExperimentUpdate]:
        experiment_id = await the_experiment(client, given)
        if "searchSpace" in changes:
            _check_space(await client.get_experiment(experiment_id), changes["searchSpace"])
        return experiment_id, await client.update_experiment(experiment_id, **changes)

    experiment_id, update = with_client(ctx, work)
    _print(experiment_id, update, changes)


def _check_space(experiment: Any, space: dict[str, Any]) -> None:
    """What the experiment's tuner would refuse in the new space, refused here, as ``experiment run`` checks a
    config before creating it (the dispatcher checks only the space's shape)."""
    config = experiment.config
    if not (config.tuner or config.advisor):
        return  # driven by its own client: the space is the client's to read
    from services.tuner.checks import check

    try:
        check(config.model_copy(update={"search_space": space}))
    except ValueError as exc:
        raise fail(f"the experiment's tuner cannot search this space: {exc}") from None


def _print(experiment_id: str, update: ExperimentUpdate, asked: dict[str, Any]) -> None:
    from contracts.changes import change_line, shown  # here: `trialbus --help` loads no contract

    out = console()
    for name, (old, new) in update.changes.items():
        out.print(f"experiment {experiment_id}: {change_line(name, old, new)}")
    for name in asked:
        if name not in update.changes:
            out.print(f"experiment {experiment_id}: {name} is {shown(asked[name])} already; nothing changed")


@app.command("concurrency")
def concurrency(ctx: typer.Context, first: First = None, second: Second = None, value: Value = None) -> None:
    """Set trialConcurrency: more fills the new slots at once; less lets the running trials finish."""
    experiment_id, text = _id_and_value(first, second, value)
    _apply(ctx, experiment_id, {"trialConcurrency": _whole(text, "trialConcurrency")})


@app.command("trialnum")
def trialnum(ctx: typer.Context, first: First = None, second: Second = None, value: Value = None) -> None:
    """Set maxTrialNumber (not below the trials submitted already)."""
    experiment_id, text = _id_and_value(first, second, value)
    _apply(ctx, experiment_id, {"maxTrialNumber": _whole(text, "maxTrialNumber")})


@app.command("duration")
def duration(ctx: typer.Context, first: First = None, second: Second = None, value: Value = None) -> None:
    """Set maxExperimentDuration: NNI's units (30m, 2h, 1d) or seconds; the deadline moves at once."""
    experiment_id, text = _id_and_value(first, second, value)
    _apply(ctx, experiment_id, {"maxExperimentDuration": float(text) if _is_number(text) else text})


@app.command("searchspace")
def searchspace(
    ctx: typer.Context,
    filename: Annotated[Path, typer.Option("--filename", "-f", help="The new search space (JSON or YAML, NNI's).")],
    experiment_id: Annotated[
        str | None, typer.Argument(metavar="[ID]", show_default=False, help="Left out: the one running experiment.")
    ] = None,
) -> None:
    """Set the search space: the experiment's tuner proposes from it from its next trial on."""
    import yaml

    try:
        space = yaml.safe_load(filename.read_text())  # JSON is YAML
    except (OSError, yaml.YAMLError) as exc:
        raise fail(f"cannot read the search space {filename}: {exc}") from None
    if not isinstance(space, dict):
        raise fail(f"{filename} must hold a search space: an object of parameters, as in NNI")
    _apply(ctx, experiment_id, {"searchSpace": space})


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
