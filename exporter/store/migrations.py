"""The history store's schema, as an ordered list of migrations.

A database records the versions applied to it in `schema_version`; at start-up the store
applies the ones after the newest recorded, each in its own transaction together with its
`schema_version` row, so a crash leaves the database at a version, never between two. A
database newer than this code (a newer release wrote it, then someone rolled back) is refused
with `SchemaTooNew` before anything is written: old code must not guess at a newer schema, and
the operator can roll forward again without a repair.

The statements are shared by SQLite and PostgreSQL; where the dialects differ (the id column,
the float type) a statement names a placeholder that `render` fills in per dialect. Never edit
a released migration: add one.

The indexes serve the reads: every list is newest first by (time, id), so each filter has an
index that starts with its equality column and goes on with (time DESC, id DESC); the planner
then walks the index and stops after a page, however many rows match.
"""

from __future__ import annotations

from dataclasses import dataclass

DIALECTS = ("sqlite", "postgresql")

_TYPES = {
    "sqlite": {"id": "INTEGER PRIMARY KEY", "float": "REAL"},
    "postgresql": {
        "id": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "float": "DOUBLE PRECISION",
    },
}

# Whether `schema_version` exists: asked before anything is created, so a refused database is
# left exactly as it was.
VERSION_TABLE_EXISTS = {
    "sqlite": "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'",
    "postgresql": "SELECT 1 FROM pg_tables"
    " WHERE schemaname = current_schema() AND tablename = 'schema_version'",
}

CREATE_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at {float} NOT NULL
)"""

CURRENT_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"
RECORD_VERSION = "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)"


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer topowatch than this one."""


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "preemptions, workloads, audit, scale_events",
        (
            """CREATE TABLE preemptions (
                id {id},
                key TEXT NOT NULL UNIQUE,
                time {float} NOT NULL,
                victim_namespace TEXT NOT NULL,
                victim_name TEXT NOT NULL,
                victim_uid TEXT NOT NULL,
                victim_cluster_queue TEXT NOT NULL,
                preemptor_namespace TEXT NOT NULL,
                preemptor_name TEXT NOT NULL,
                preemptor_uid TEXT NOT NULL,
                preemptor_cluster_queue TEXT NOT NULL,
                reason TEXT NOT NULL,
                verdict TEXT NOT NULL,
                gpus_freed INTEGER NOT NULL,
                observed TEXT NOT NULL,
                document TEXT NOT NULL
            )""",
            "CREATE INDEX preemptions_time ON preemptions (time DESC, id DESC)",
            "CREATE INDEX preemptions_namespace"
            " ON preemptions (victim_namespace, time DESC, id DESC)",
            "CREATE INDEX preemptions_victim_queue"
            " ON preemptions (victim_cluster_queue, time DESC, id DESC)",
            "CREATE INDEX preemptions_preemptor_queue"
            " ON preemptions (preemptor_cluster_queue, time DESC, id DESC)",
            "CREATE INDEX preemptions_verdict ON preemptions (verdict, time DESC, id DESC)",
            """CREATE TABLE workloads (
                id {id},
                uid TEXT NOT NULL UNIQUE,
                namespace TEXT NOT NULL,
                name TEXT NOT NULL,
                cluster_queue TEXT NOT NULL,
                finished_at {float} NOT NULL,
                deleted BOOLEAN NOT NULL,
                document TEXT NOT NULL
            )""",
            "CREATE INDEX workloads_name ON workloads (namespace, name, finished_at DESC)",
            "CREATE INDEX workloads_finished ON workloads (finished_at DESC, id DESC)",
            """CREATE TABLE audit (
                id {id},
                digest TEXT NOT NULL UNIQUE,
                time {float} NOT NULL,
                node TEXT NOT NULL,
                kind TEXT NOT NULL,
                verdict TEXT NOT NULL,
                reason TEXT NOT NULL,
                action TEXT NOT NULL,
                document TEXT NOT NULL
            )""",
            "CREATE INDEX audit_time ON audit (time DESC, id DESC)",
            "CREATE INDEX audit_node ON audit (node, time DESC, id DESC)",
            """CREATE TABLE scale_events (
                id {id},
                key TEXT NOT NULL UNIQUE,
                time {float} NOT NULL,
                namespace TEXT NOT NULL,
                job TEXT NOT NULL,
                kind TEXT NOT NULL,
                cause TEXT NOT NULL,
                document TEXT NOT NULL
            )""",
            "CREATE INDEX scale_events_time ON scale_events (time DESC, id DESC)",
        ),
    ),
    Migration(
        2,
        "preemptions by victim name, for merging copies of one preemption",
        # A write looks up the rows of its victims (by name, a batch at a time) to merge
        # copies of one preemption written under different keys (records.merge_preemption).
        ("CREATE INDEX preemptions_victim ON preemptions (victim_name, victim_namespace, time)",),
    ),
    Migration(
        3,
        "goodput: interruptions, job phase totals, hardware findings, GPU-second totals",
        (
            """CREATE TABLE goodput (
                id {id},
                key TEXT NOT NULL UNIQUE,
                kind TEXT NOT NULL,
                time {float} NOT NULL,
                namespace TEXT NOT NULL,
                job TEXT NOT NULL,
                document TEXT NOT NULL
            )""",
            "CREATE INDEX goodput_kind ON goodput (kind, time DESC, id DESC)",
            "CREATE INDEX goodput_job ON goodput (kind, namespace, job, time DESC, id DESC)",
        ),
    ),
    Migration(
        4,
        "audit: the admission check's decisions (kind admission), by workload",
        # Admission decisions share the audit table (records.AuditRow); `subject` is the
        # workload they judged. Existing rows, remediation's, are about no subject.
        (
            "ALTER TABLE audit ADD COLUMN subject TEXT NOT NULL DEFAULT ''",
            "CREATE INDEX audit_kind ON audit (kind, time DESC, id DESC)",
            "CREATE INDEX audit_subject ON audit (kind, subject, time DESC, id DESC)",
        ),
    ),
)

LATEST = MIGRATIONS[-1].version


def render(sql: str, dialect: str) -> str:
    """`sql` with the dialect's types in place of {id} and {float}."""
    return sql.format(**_TYPES[dialect])


def pending(found: int) -> tuple[Migration, ...]:
    """The migrations a database at version `found` still needs; SchemaTooNew past LATEST."""
    if found > LATEST:
        raise SchemaTooNew(
            f"the history database is at schema version {found}, but this topowatch knows only"
            f" versions up to {LATEST}: a newer release migrated it. Run that release (or newer)"
            " or point this one at another database; the database was left untouched."
        )
    return tuple(m for m in MIGRATIONS if m.version > found)
