"""An experiment's trials as ``nnictl experiment export`` writes them: the CLI's name for
:mod:`services.common.export`, which the web UI's export shares."""

from services.common.export import TAIL, as_csv, as_json, records

__all__ = ["TAIL", "as_csv", "as_json", "records"]
