"""What a store operation raises besides the client libraries' own errors.

Defined apart from the interface (:mod:`~runfolder.storage.base`) and the retry policy
(:mod:`~runfolder.storage.retry`) because both need them: the interface raises them, the
policy never retries them. This module imports nothing, so neither has to import the other.
"""

from __future__ import annotations


class NotFound(Exception):
    """The key does not exist in the store."""


class PreconditionFailed(Exception):  # noqa: N818 - the store's own word for it (HTTP 412)
    """A conditional write found the object in another state than the caller expected.

    Raised by :meth:`Store.put_bytes_if`: the object exists (a create-only write) or has
    changed since the version the caller read. Never retried: reading again is the caller's move.
    """


class WriteConflict(PreconditionFailed):
    """A conditional write met another write to the same object in flight (S3 409
    ``ConditionalRequestConflict``, GCS 409 ``Conflict``): nothing was decided about this one.

    The object may well still be at the version the caller read; both stores say to read
    again and retry. A :class:`PreconditionFailed` (so callers that only read again keep
    working), told apart by callers for whom a refused write means something final.
    """


class Cancelled(Exception):  # noqa: N818 - a state the caller asked for, not an error
    """A transfer was aborted because its caller no longer wants it (never retried)."""
