"""``python -m services.dispatcher``"""

from services.common.lifecycle import run
from services.common.settings import load_settings
from services.dispatcher.service import DispatcherService
from services.dispatcher.settings import DispatcherSettings


def main() -> None:
    settings = load_settings(DispatcherSettings, "dispatcher")
    run(lambda: (DispatcherService(settings), settings))


if __name__ == "__main__":
    main()
