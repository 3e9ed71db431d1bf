"""The columns of the task and job tables, shared by the SQL stores (SQLite and PostgreSQL).

One list per table, in order, after the ``seq`` column each table starts with; the JSON-encoded
columns (payloads, results, inputs) are named apart. A column added here needs a schema version
and a migration in every SQL store.
"""

from __future__ import annotations

COLUMNS = (
    "id",
    "key",
    "kind",
    "provider",
    "priority",
    "status",
    "cost_estimate",
    "attempts",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "payload",
    "result",
    "error",
    "deduped_from",
    "worker",
    "tenant",
    "route",
)
"""Columns of the ``tasks`` table, after ``seq`` (``tenant``: schema version 4 of the SQL stores;
``route``: version 5)."""
JSON_COLUMNS = frozenset({"payload", "result"})

JOB_COLUMNS = (
    "id",
    "key",
    "name",
    "version",
    "priority",
    "status",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "inputs",
    "results",
    "stage_tasks",
    "failed_stage",
    "error",
    "deduped_from",
    "worker",
    "tenant",
)
"""Columns of the ``jobs`` table (schema version 3, jobs), after ``seq`` (``tenant``: version 5)."""
JOB_JSON_COLUMNS = frozenset({"inputs", "results", "stage_tasks"})
