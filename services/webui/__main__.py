"""``python -m services.webui``"""

from services.common.lifecycle import run
from services.common.settings import load_settings
from services.webui.service import WebuiService
from services.webui.settings import WebuiSettings


def main() -> None:
    settings = load_settings(WebuiSettings, "webui")
    run(lambda: (WebuiService(settings), settings))


if __name__ == "__main__":
    main()
