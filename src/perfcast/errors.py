"""Exception and warning hierarchy of perfcast.

Every error that bad input can cause derives from :class:`PerfcastError`, so the CLI and
the HTTP service can turn it into one clear line (CLI exit code 2, HTTP 422).
"""

from __future__ import annotations


class PerfcastError(Exception):
    """Base class of every error perfcast raises on purpose."""


class SpecError(PerfcastError, ValueError):
    """Invalid input: a spec field, a table column or a cross-field rule.

    Messages name the field, the value received and what is allowed,
    e.g. ``"tp=3 does not divide num_heads=32"``.
    """


class UnknownEntryError(SpecError, KeyError):
    """A catalog id or device name that resolves to no entry; the message suggests close matches."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class DatasetError(PerfcastError):
    """A dataset that is missing, malformed or fails validation on load."""


class BundleError(PerfcastError):
    """A saved predictor bundle that cannot be loaded (missing files, FeatureSpec mismatch)."""


class OutOfDomainWarning(UserWarning):
    """Input outside the range a predictor was trained on; the prediction still runs."""


class AtMFUCeilingWarning(UserWarning):
    """Step predictions raised to their MFU ceiling: the bound answered, not the model's estimate."""
