"""``python -m services.metrics_gateway``"""

import sys

from pydantic import ValidationError

from services.common.lifecycle import run
from services.metrics_gateway.service import GatewayService
from services.metrics_gateway.settings import GatewaySettings


def main() -> None:
    try:
        settings = GatewaySettings()
    except ValidationError as exc:
        if any(error["loc"] == ("trial_secret",) for error in exc.errors()):
            sys.exit(
                "metrics-gateway: TRIALBUS_TRIAL_SECRET is not set (or empty). Set it to the same value as the "
                "dispatcher's TRIALBUS_TRIAL_SECRET: trial tokens are HMACs under that secret."
            )
        problems = "; ".join(f"TRIALBUS_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        sys.exit(f"metrics-gateway: invalid settings: {problems}")
    run(lambda: (GatewayService(settings), settings))


if __name__ == "__main__":
    main()
