"""``python -m services.webui``"""

import sys

from pydantic import ValidationError

from services.common.lifecycle import run
from services.webui.service import WebuiService
from services.webui.settings import WebuiSettings


def main() -> None:
    try:
        settings = WebuiSettings()
    except ValidationError as exc:
        if any(error["loc"] == ("api_token",) for error in exc.errors()):
            sys.exit(
                "webui: TRIALBUS_API_TOKEN is set but empty. Unset it to serve without a token (then keep "
                "TRIALBUS_WEBUI_HOST=127.0.0.1), or set it to the dispatcher's TRIALBUS_API_TOKEN."
            )
        problems = "; ".join(f"TRIALBUS_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        sys.exit(f"webui: invalid settings: {problems}")
    run(lambda: (WebuiService(settings), settings))


if __name__ == "__main__":
    main()
