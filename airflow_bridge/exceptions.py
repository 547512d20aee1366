"""The bridge's error vocabulary. Every error carries a one-line message for the task log.

Hierarchy::

    KfpError
    ├── KfpApiError            an HTTP call to the KFP API failed (status, method, url)
    │   ├── KfpAuthError       401/403: the credentials were refused
    │   └── KfpNotFoundError   404
    ├── KfpConfigError         the connection or operator arguments are unusable (ValueError too)
    ├── KfpPackageError        the compiled pipeline or its parameters are unusable (ValueError too)
    └── KfpRunError            the run ended badly (run_id, state, url)
        ├── KfpRunFailedError      FAILED (message = the run's error message)
        ├── KfpRunCanceledError    CANCELED
        ├── KfpRunTimeoutError     the deadline passed before a terminal state
        └── KfpTaskKilledError     the task was killed while it waited (sync mode; retried)
"""

from __future__ import annotations


class KfpError(Exception):
    """Base class of every bridge error."""


class KfpApiError(KfpError):
    """An HTTP call to the KFP API failed.

    Args:
        message: one line, the server's own message included.
        status_code: HTTP status, or ``None`` when no response came (connection error).
        method: HTTP method.
        url: the request URL (never contains credentials).
    """

    def __init__(
        self, message: str, *, status_code: int | None = None, method: str = "", url: str = ""
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.method = method
        self.url = url

    def retold(self, message: str) -> KfpApiError:
        """A plain (retried) :class:`KfpApiError` with ``message`` and this one's status, method and URL."""
        return KfpApiError(message, status_code=self.status_code, method=self.method, url=self.url)


class KfpAuthError(KfpApiError):
    """The KFP API refused the credentials (HTTP 401 or 403)."""


class KfpNotFoundError(KfpApiError):
    """The object does not exist (HTTP 404)."""


class KfpConfigError(KfpError, ValueError):
    """A connection field or an operator argument is missing or invalid."""


class KfpPackageError(KfpError, ValueError):
    """The compiled pipeline package or the run parameters are unusable."""


class KfpRunError(KfpError):
    """A KFP run did not succeed.

    Args:
        message: one line (the run's own error message when it has one).
        run_id: the KFP run id.
        state: the run's last state.
        url: the run's page in the KFP UI.
    """

    def __init__(self, message: str, *, run_id: str, state: str | None, url: str = "") -> None:
        super().__init__(message)
        self.run_id = run_id
        self.state = state
        self.url = url


class KfpRunFailedError(KfpRunError):
    """The run ended FAILED."""


class KfpRunCanceledError(KfpRunError):
    """The run ended CANCELED (terminated by a user or by this bridge)."""


class KfpRunTimeoutError(KfpRunError):
    """The run did not reach a terminal state before the deadline."""


class KfpTaskKilledError(KfpRunError):
    """The task was killed while it waited in sync mode (``on_kill``: a worker's graceful shutdown,
    an eviction, a user's *mark failed*); its run was terminated, best effort. Retried, unlike a
    run someone else canceled: the retry submits a new run, which resumes from the checkpoints."""
