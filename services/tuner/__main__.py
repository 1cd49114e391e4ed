"""``python -m services.tuner``"""

import sys

import optuna
from pydantic import ValidationError

from services.common.lifecycle import run
from services.tuner.service import TunerService
from services.tuner.settings import TunerSettings


def main() -> None:
    try:
        settings = TunerSettings()
    except ValidationError as exc:
        problems = "; ".join(f"TRIALBUS_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        sys.exit(f"tuner: invalid settings: {problems}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial would drown the service's log
    run(lambda: (TunerService(settings), settings))


if __name__ == "__main__":
    main()
