"""Exceptions for errors reported by Sluice's C++ core.

Every C++ ``Status`` that reaches Python becomes an instance of :class:`Error`,
more precisely of the subclass named after its code (``NotFound``,
``Timeout``, ...), carrying ``code`` and ``message`` unchanged. Subclasses also
derive from the closest built-in exception, so ``except TimeoutError`` or
``except ValueError`` catch them too:

==================== ============================
code                 also a
==================== ============================
InvalidArgument      ValueError
OutOfRange           ValueError
NotFound             LookupError
Timeout              TimeoutError
Unavailable          ConnectionError
Unimplemented        NotImplementedError
others               (Error only)
==================== ============================

Mistakes the Python layer catches before calling the core (a wrong type, a
batch size that disagrees, ...) raise plain ``TypeError`` / ``ValueError``.
"""


class Error(Exception):
    """An error status from Sluice's C++ core: ``code`` and ``message``."""

    code = "Unknown"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self):  # picklable (e.g. across multiprocessing)
        return (type(self), (self.message,))


class InvalidArgument(Error, ValueError):
    code = "InvalidArgument"


class NotFound(Error, LookupError):
    code = "NotFound"


class AlreadyExists(Error):
    code = "AlreadyExists"


class OutOfRange(Error, ValueError):
    code = "OutOfRange"


class FailedPrecondition(Error):
    code = "FailedPrecondition"


class ResourceExhausted(Error):
    code = "ResourceExhausted"


class Timeout(Error, TimeoutError):
    code = "Timeout"


class Aborted(Error):
    code = "Aborted"


class Unavailable(Error, ConnectionError):
    code = "Unavailable"


class DataLoss(Error):
    code = "DataLoss"


class Unimplemented(Error, NotImplementedError):
    code = "Unimplemented"


class Internal(Error):
    code = "Internal"


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        OutOfRange,
        FailedPrecondition,
        ResourceExhausted,
        Timeout,
        Aborted,
        Unavailable,
        DataLoss,
        Unimplemented,
        Internal,
    )
}


def _from_status(code: str, message: str) -> Error:
    """The exception for a C++ status (called by the extension)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = Error(message)
        err.code = code
        return err
    return cls(message)


__all__ = ["Error"] + sorted(_BY_CODE)
