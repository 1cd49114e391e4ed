"""The one exception the API layers translate into an answer."""


class ApiError(Exception):
    """An API call that cannot be served; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
