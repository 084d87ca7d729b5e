"""The exceptions async_search raises, in one flat set."""


class InputSpecError(ValueError):
    """A request does not match the model's input spec (shape, dtype or type)."""


class ModelOutputError(RuntimeError):
    """A model returned outputs that do not match its batch (wrong type or row count)."""


class ServerClosedError(RuntimeError):
    """The server was closed (or its context left) before the request could be served."""


class ServerDiedError(RuntimeError):
    """A server, process or actor died while requests were waiting on it."""


class SearchError(RuntimeError):
    """Searches failed: ``failures`` maps each failed start's index to what went wrong."""

    def __init__(self, message: str, failures: dict | None = None):
        super().__init__(message)
        self.failures = failures or {}


class CircuitOpenError(RuntimeError):
    """Every server that could take a request has an open circuit breaker."""
