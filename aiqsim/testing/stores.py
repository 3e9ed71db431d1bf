"""Stores for crash tests: one factory per store kind that opens the *same* store again after a crash.

A crash test needs a store that outlives the simulated process: :meth:`StoreFactory.open` is
called once per process life and returns the store as a restarted process would find it (the
same file reopened; the same in-memory object, which survives only simulated crashes; the same
PostgreSQL schema on a new connection). :meth:`StoreFactory.fresh` gives a factory for an empty
store of the same kind, so each crash case starts from nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

from aiqsim.core.errors import ConfigurationError
from aiqsim.stores.base import TaskStore

__all__ = ["STORE_KINDS", "StoreFactory", "store_kinds"]

STORE_KINDS = ("memory", "json", "sqlite", "postgres")
"""Every kind the kit can open; ``postgres`` only when a DSN is configured."""


def store_kinds(postgres_dsn: str | None) -> tuple[str, ...]:
    """The kinds a store fixture runs over: memory, JSON and SQLite, plus PostgreSQL with a DSN."""
    return STORE_KINDS if postgres_dsn else STORE_KINDS[:3]


class StoreFactory:
    """Opens one store of ``kind`` (``memory``, ``json``, ``sqlite`` or ``postgres``) again and again.

    File stores live in ``directory``; a PostgreSQL store lives in its own schema (``schema``) of
    the database at ``postgres_dsn``, dropped by :meth:`cleanup`.
    """

    def __init__(
        self,
        kind: str,
        directory: str | Path,
        *,
        postgres_dsn: str | None = None,
        schema: str = "aiqsim_kit",
    ) -> None:
        if kind not in STORE_KINDS:
            raise ConfigurationError(f"unknown store kind {kind!r}; expected one of {STORE_KINDS}")
        if kind == "postgres" and not postgres_dsn:
            raise ConfigurationError(
                "the postgres store kind needs a DSN "
                "(env AIQSIM_TEST_POSTGRES_DSN or ini aiqsim_postgres_dsn)"
            )
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
            raise ConfigurationError(f"schema must be a lower-case SQL identifier, got {schema!r}")
        self.kind = kind
        self.directory = Path(directory)
        self.postgres_dsn = postgres_dsn
        self.schema = schema
        self._memory: TaskStore | None = None
        self._fresh = 0

    @property
    def durable(self) -> bool:
        """Whether the store lives outside the process (closed at a crash, reopened at the restart)."""
        return self.kind != "memory"

    @property
    def path(self) -> Path:
        """The store's file (JSON and SQLite kinds)."""
        return self.directory / ("tasks.json" if self.kind == "json" else "tasks.sqlite3")

    def open(self) -> TaskStore:
        """The store as the next process life finds it."""
        if self.kind == "memory":
            if self._memory is None:
                from aiqsim.stores.memory import MemoryStore

                self._memory = MemoryStore()
            return self._memory
        if self.kind == "postgres":
            from aiqsim.stores.postgres import PostgresStore

            return PostgresStore(self.postgres_dsn or "", schema=self.schema)
        from aiqsim.stores import open_store

        self.directory.mkdir(parents=True, exist_ok=True)
        return open_store(self.kind, self.path)

    def fresh(self, label: str) -> StoreFactory:
        """A factory of the same kind for a new, empty store (a subdirectory, or a new schema)."""
        self._fresh += 1
        safe = re.sub(r"[^a-z0-9_]", "_", label.lower())
        return StoreFactory(
            self.kind,
            self.directory / f"{safe}-{self._fresh}",
            postgres_dsn=self.postgres_dsn,
            schema=f"{self.schema}_{safe}_{self._fresh}"[:63],
        )

    def cleanup(self) -> None:
        """Drop what this factory created that a temporary directory does not remove (a schema)."""
        if self.kind == "postgres" and self.postgres_dsn:
            import psycopg

            with psycopg.connect(self.postgres_dsn, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")

    def __repr__(self) -> str:
        where = self.schema if self.kind == "postgres" else str(self.directory)
        return f"<StoreFactory {self.kind} at {where}>"
