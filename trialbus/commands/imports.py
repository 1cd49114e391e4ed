"""``trialbus experiment import ID -f results.json|results.csv``: nnictl experiment import."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trialbus.commands.common import console, the_experiment, with_client
from trialbus.output import fail


def import_results(
    ctx: typer.Context,
    experiment_id: Annotated[
        str | None, typer.Argument(metavar="ID", show_default=False, help="Left out: the one running experiment.")
    ] = None,
    filename: Annotated[
        Path,
        typer.Option(
            "--filename", "-f", help="Earlier results: nnictl's JSON list of {parameter, value}, or a .csv file."
        ),
    ] = ...,  # type: ignore[assignment]
) -> None:
    """Import earlier results (nnictl experiment import): the experiment's tuner learns from them before it
    proposes, or at once if it runs. JSON: [{"parameter": {...}, "value": 0.9}, ...]; CSV: a header of
    parameter names, then a reward (or default) column, as nnictl experiment export writes it; an export of
    trialbus imports as it is (its trials that did not succeed left out). A bad row is an error naming it,
    and nothing is imported."""
    from trialbus.imports import read_results

    try:
        rows, skipped = read_results(filename)  # the file's errors show before any connection is tried
    except ValueError as exc:
        raise fail(str(exc)) from None

    async def work(client):  # noqa: ANN001, ANN202 - the client loads with the command
        return await client.import_results(await the_experiment(client, experiment_id), rows)

    experiment = with_client(ctx, work)
    left_out = f"; {skipped} rows of trials that did not succeed left out" if skipped else ""
    console().print(
        f"experiment {experiment.id}: imported {len(rows)} results ({experiment.imported} in all{left_out}); "
        "its tuner learns from them before its next proposals"
    )
