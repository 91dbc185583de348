"""Project errors, shared by every layer.

Domain code raises these; only the bodies (the CLI, the operator's ``handlers.py``) map them
to exit codes or to kopf's temporary/permanent errors. Every message says what is wrong and
what to do about it, in one line.
"""

from __future__ import annotations

__all__ = [
    "InputError",
    "NoDataError",
    "QueryRejectedError",
    "RolloutStuckError",
    "SourceUnavailableError",
    "SpecError",
    "SpecTuneError",
    "UnauthorizedError",
    "WindowCutError",
]


class SpecTuneError(Exception):
    """Base of every error spectune raises on purpose."""


class SpecError(SpecTuneError):
    """A permanent error in what the user asked for: a bad flag, field or spec value.

    Retrying does not help; the user has to change the input.
    """


class InputError(SpecError):
    """Input data (a metric page, a file) cannot be used as given."""


class NoDataError(SpecTuneError):
    """The source answered, but has no samples for what was asked (temporary).

    An idle ``rate()`` is NaN: that means "no sample", never "acceptance 0".
    """


class SourceUnavailableError(SpecTuneError):
    """The metric source could not be reached or answered garbage (temporary)."""


class UnauthorizedError(SourceUnavailableError):
    """The metric source refused the credentials (HTTP 401 or 403), a temporary error.

    Credentials are fixed outside the spec (a Secret rotated, a grant given), so the setting
    is held and the source asked again later; it is never an invalid spec.
    """


class QueryRejectedError(SourceUnavailableError):
    """Prometheus rejected a query spectune built as ``bad_data`` (HTTP 400), a temporary error.

    The query is the operator's: a template of the engine's catalogue around the user's
    selector, which :func:`~spectune.selectors.validate_selector` has already checked. What
    remains is a regular expression of the selector that Prometheus' RE2 refuses, or an
    operator bug or a Prometheus too old for the query; neither is sure to be the spec, so
    the setting is held and the query tried again, never a ``Failed`` SpecTuning.
    """


class RolloutStuckError(SpecTuneError):
    """A rollout will not become ready on its own (ProgressDeadlineExceeded, crash loop)."""


class WindowCutError(SpecTuneError):
    """A measurement window was cut short: the model changed under it, or the run ended.

    (Temporary.) The run that ends is a simulated scenario's, in the bench. The window's
    figures mix two models, or cover less than a window, so they are dropped; the next
    step sees the change.
    """
