"""Errors that stop a run because of its input, not because of a bug.

Each message names the stage, the file, row or feature, and what to change. The pipeline CLI prints
them as one line (no traceback; the full log is written beside the output)."""


class InputError(ValueError):
    """The input cannot be read as configured (no file, no header, missing columns, corrupt framing)."""


class LedgerError(RuntimeError):
    """Rows in and rows out of a stage do not add up: rows were lost (or invented) somewhere."""


class FeatureHealthError(ValueError):
    """A feature's share of missing or invalid values is above input.max_invalid_share."""


def one_line(e: BaseException) -> str:
    """The cause of a failure in one line: an input, ledger or feature-health error's own first line
    (it names the field, file or row and what to change); any other error's type and first line."""
    text = str(e).strip().splitlines()
    if isinstance(e, (InputError, LedgerError, FeatureHealthError)):
        return text[0] if text else type(e).__name__
    return f"{type(e).__name__}: {text[0] if text else ''}"
