"""Task stores: where task records, idempotency claims and poison keys live.

- :class:`MemoryStore`: in-process dict; fastest, survives only simulated crashes.
- :class:`SqliteStore`: the default durable store; one SQLite file shared safely by processes.
- :class:`JsonFileStore`: a human-readable JSON snapshot plus journal; single process only.
- :class:`PostgresStore`: PostgreSQL, for workers on several hosts (the ``postgres`` extra; imported
  on first use, so ``aiqsim.stores`` works without psycopg).
"""

from __future__ import annotations

import os

from aiqsim.core.errors import ConfigurationError
from aiqsim.stores.base import (
    DuplicateTaskIdError,
    PurgeReport,
    StoreAccessError,
    StoreClosedError,
    StoreCorruptError,
    StoreLockedError,
    StoreOpenError,
    StoreWriteError,
    StoreWriteOutcomeUnknownError,
    TaskStore,
    UnstorableValueError,
    claim_owner,
)
from aiqsim.stores.json_file import JsonFileStore
from aiqsim.stores.memory import MemoryStore
from aiqsim.stores.retention import RetentionPolicy, purge_periodically
from aiqsim.stores.sqlite import SqliteStore

STORE_KINDS = ("memory", "json", "sqlite")


def open_store(kind: str, path: str | os.PathLike[str] | None = None) -> TaskStore:
    """Open a store by name: ``"memory"`` (no path), ``"json"`` or ``"sqlite"`` (path required).

    A kind or path that does not fit raises :class:`~aiqsim.core.errors.ConfigurationError` (a
    ``ValueError``) before any file is touched.
    """
    if kind == "memory":
        if path is not None:
            raise ConfigurationError(
                f"path: the memory store keeps nothing on disk; do not pass a path (got {str(path)!r}). "
                "No store was opened"
            )
        return MemoryStore()
    if kind not in STORE_KINDS:
        raise ConfigurationError(
            f"kind: unknown store kind {kind!r}; expected one of {STORE_KINDS}. No store was opened"
        )
    if path is None:
        raise ConfigurationError(f"path: the {kind} store needs a file path; no store was opened")
    return JsonFileStore(path) if kind == "json" else SqliteStore(path)


def __getattr__(name: str) -> object:
    if name == "PostgresStore":  # psycopg is an optional extra: import it only when asked for
        from aiqsim.stores.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "STORE_KINDS",
    "DuplicateTaskIdError",
    "JsonFileStore",
    "MemoryStore",
    "PostgresStore",
    "PurgeReport",
    "RetentionPolicy",
    "SqliteStore",
    "StoreAccessError",
    "StoreClosedError",
    "StoreCorruptError",
    "StoreLockedError",
    "StoreOpenError",
    "StoreWriteError",
    "StoreWriteOutcomeUnknownError",
    "TaskStore",
    "UnstorableValueError",
    "claim_owner",
    "open_store",
    "purge_periodically",
]

# Jobs: the job-table protocol every store implements.
from aiqsim.stores.job_store import JobStore, claim_job_owner  # noqa: E402

__all__ += ["JobStore", "claim_job_owner"]
