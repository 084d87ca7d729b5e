"""The exceptions async_search raises, in one flat set."""

__all__ = ["InputSpecError", "ModelOutputError", "ServerClosedError", "ServerDiedError",
           "ServerCrashedError", "ModelRaisedError", "SearchError", "CircuitOpenError",
           "RemoteError", "RemoteTraceback", "ClosedConnection", "ProtocolError",
           "ResponseTooLongError",
           "MalformedMessageError", "RepositoryError", "ModelNotFoundError",
           "ModelNotReadyError", "ModelBusyError", "ModelLoadError", "LoadParametersError",
           "FileWriteError",
           "CheckpointError", "DeviceNotFoundError", "CloseTimeoutError",
           "ConnectionGoneError", "RequestTimeoutError", "SearchTimeoutError",
           "WorkerDiedError", "add_note", "deliverable", "describe"]


class ClosedConnection(Exception):
    """The stream was closed by its sender (or the process at its other end is gone):
    nothing more will arrive."""


class InputSpecError(ValueError):
    """A request does not match the model's input spec (shape, dtype or type)."""


class ModelOutputError(RuntimeError):
    """A model returned outputs that do not match its batch (wrong type or row count)."""


class ResponseTooLongError(ModelOutputError):
    """A remote server's answer was longer than the client's ``max_response_bytes``
    (once inflated): refused before more of it was held."""


class ServerClosedError(RuntimeError):
    """The server was closed (or its context left) before the request could be served."""


class ServerDiedError(RuntimeError):
    """A server, process or actor died while requests were waiting on it."""


class ServerCrashedError(ServerClosedError):
    """The serving coroutine died: every pending request failed and the server closed;
    what killed it is the ``__cause__``."""


class ModelRaisedError(RuntimeError):
    """The model raised what a caller cannot receive as it is (StopIteration,
    CancelledError, SystemExit...): its batch fails with this; the original is the
    ``__cause__``."""


class SearchError(RuntimeError):
    """Searches failed: ``failures`` maps each failed start's index to what went wrong."""

    def __init__(self, message: str, failures: dict | None = None):
        super().__init__(message)
        self.failures = failures or {}


class CircuitOpenError(RuntimeError):
    """Every server that could take a request has an open circuit breaker."""


class RemoteError(RuntimeError):
    """An exception from another process, carried as text: type name, message, traceback.

    Used in place of an exception that cannot travel between processes as itself (it
    does not pickle, or its pickle does not load). ``type_name`` and ``remote_mro`` (the
    qualified names of its classes) say what it was; ``remote_traceback`` is its
    formatted traceback where it was raised. It always pickles.
    """

    def __init__(self, type_name: str, message: str, remote_traceback: str = "",
                 remote_mro: tuple = ()):
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback
        self.remote_mro = tuple(remote_mro)

    def __reduce__(self):
        notes = [str(n) for n in getattr(self, "__notes__", ())]
        return (type(self), (self.type_name, self.message, self.remote_traceback,
                             self.remote_mro), {"__notes__": notes} if notes else None)


class RemoteTraceback(Exception):
    """The traceback of an exception where it was raised (the ``__cause__`` it shows)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text


class MalformedMessageError(TypeError):
    """A connection's end received a message not of the form it takes (a forked server
    end's ``(key, payload)`` from a known client, a pass-through end's ``(key,
    value)``): it cannot be answered, and a server drops it."""


class ProtocolError(ValueError):
    """A request that breaks the inference protocol; ``status`` is the HTTP answer."""

    #: Statuses that a request's own content earns (malformed, too large, not
    #: processable); others (401, 403, 405, 409...) say how the server is set up.
    CALLER_STATUSES = frozenset({400, 413, 422})

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status

    @property
    def is_callers(self) -> bool:
        """Whether the request's own content earned it (``CALLER_STATUSES``): a router
        counts the others against the server that answered so."""
        return self.status in self.CALLER_STATUSES

    def __reduce__(self):  # keeps the status across processes (decoding off the loop)
        return type(self), (str(self), self.status)


class RepositoryError(Exception):
    """A model repository refused a request (the subclasses say why)."""


class ModelNotFoundError(RepositoryError, LookupError):
    """The repository has no model of that name, or the model has no such version."""


class ModelNotReadyError(RepositoryError):
    """The model is known but not loaded now (unloaded, or its last load failed)."""


class ModelLoadError(RepositoryError):
    """Loading a model failed: its factory or its server raised (the ``__cause__``)."""


class ModelBusyError(RepositoryError):
    """A load or unload of the model is under way (the HTTP front's 409: retry later)."""


class LoadParametersError(RepositoryError, ValueError):
    """A load request's parameters are unknown, out of range, or not for this model."""


class DeviceNotFoundError(ValueError):
    """A model was placed on a device this machine does not have ("cuda:7", "tpu:0")."""


class FileWriteError(OSError):
    """A file could not be written (a full disk, a file-size limit, no permission...):
    the message names the file and the operation that failed; the file that was there
    is whole and no temporary is left. ``errno`` is the cause's, ``filename`` the file."""

    def __init__(self, message: str, errno: int | None = None, filename: str | None = None):
        super().__init__(message)
        self.errno, self.strerror, self.filename = errno, message, filename

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self):
        return type(self), (self.strerror, self.errno, self.filename)


class CheckpointError(ValueError):
    """A saved file (a checkpoint, a replay buffer, a training run's state) is missing,
    truncated, corrupt, of another format or out of range: the message names the file and
    what is wrong with it."""


class CloseTimeoutError(TimeoutError):
    """A server did not finish closing within ``aclose(timeout=...)``: it failed what it
    still held and told its device threads to end; the message says what it abandoned.
    ``batches_in_model``: batches the model was computing and had not returned (batches
    still waiting for a device thread are dropped, and not counted); ``requests_failed``:
    requests failed with ServerClosedError; ``threads``: names of the device threads
    still running (each unloads its model and ends when the model returns)."""

    def __init__(self, message: str, batches_in_model: int = 0, requests_failed: int = 0,
                 threads: tuple = ()):
        super().__init__(message)
        self.batches_in_model = batches_in_model
        self.requests_failed = requests_failed
        self.threads = tuple(threads)

    def __reduce__(self):
        return type(self), (str(self), self.batches_in_model, self.requests_failed,
                            self.threads)


class ConnectionGoneError(ServerDiedError, ClosedConnection):
    """The server's end of a connection is gone (it closed its stream, or its process
    died): the request was not answered, and every later call fails at once. It is a
    ``ServerDiedError`` and a ``queues.ClosedConnection``: catch either."""


class RequestTimeoutError(TimeoutError):
    """A request's deadline (``evaluate(x, timeout=...)``) passed before its answer came;
    a request not batched by then was dropped before the model ran."""


class SearchTimeoutError(TimeoutError):
    """A search did not finish by its deadline (``run_searches``'s ``timeout`` for the
    run, or its ``search_timeout``): it was stopped, and its worker with it."""


class WorkerDiedError(SearchError):
    """A search's worker (client process, Ray task, its node, or every server it could
    reach) died on each of its attempts; ``attempts`` says what ended each one."""

    def __init__(self, message: str, attempts: tuple = ()):
        super().__init__(message)
        self.attempts = tuple(attempts)

    def __reduce__(self):
        return type(self), (str(self), self.attempts)


def deliverable(error: BaseException) -> Exception:
    """``error`` as an exception a future can carry to its caller.

    ``Future.set_exception`` refuses StopIteration, a CancelledError would read as the
    caller's own cancellation, and KeyboardInterrupt or SystemExit would stop the loop
    of whoever awaits it; those come back wrapped in a ModelRaisedError (as PEP 479 wraps
    a StopIteration raised in a generator). Any other Exception is returned as it is.
    """
    if isinstance(error, Exception) and not isinstance(
            error, (StopIteration, StopAsyncIteration)):
        return error
    wrapped = ModelRaisedError(
        f"the model raised {describe(error)}, which cannot reach its callers as it is; "
        f"the batch failed")
    wrapped.__cause__ = error
    return wrapped


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``, also for an exception whose raiser set ``__notes__`` to
    something that is no list (``add_note`` raises TypeError then): its notes become a
    list of their text, with ``note`` last.

    Example:
        >>> e = ValueError("x"); e.__notes__ = ("set by hand",)
        >>> add_note(e, "where"); e.__notes__
        ['set by hand', 'where']
    """
    try:
        error.add_note(note)
    except TypeError:
        notes = getattr(error, "__notes__", ())
        kept = notes if isinstance(notes, (list, tuple)) else [notes]  # a str is one
        error.__notes__ = [*(_text(n) for n in kept), note]


def _text(note: object) -> str:
    """``str(note)``, or its type's name when its ``__str__`` raises."""
    try:
        return str(note)
    except Exception:  # noqa: BLE001 - a hostile or broken __str__
        return f"<a {type(note).__name__} note>"


def describe(error: BaseException) -> str:
    """``TypeName: message`` for an error message, or the type name alone when the
    message is empty or its ``__str__`` raises (an error may be hostile too)."""
    try:
        detail = str(error)
    except Exception:  # noqa: BLE001 - the name alone then
        detail = ""
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__
