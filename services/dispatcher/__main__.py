"""``python -m services.dispatcher``"""

import sys

from pydantic import ValidationError

from services.common.lifecycle import run
from services.dispatcher.service import DispatcherService
from services.dispatcher.settings import DispatcherSettings


def main() -> None:
    try:
        settings = DispatcherSettings()
    except ValidationError as exc:
        missing = [".".join(map(str, e["loc"])) for e in exc.errors()]
        sys.exit(
            f"dispatcher: invalid settings ({exc.error_count()} problem(s): {', '.join(missing)}). "
            "TRIALBUS_TRIAL_SECRET is required and must match the metrics gateway's."
        )
    run(lambda: (DispatcherService(settings), settings))


if __name__ == "__main__":
    main()
