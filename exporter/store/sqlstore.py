"""The history store on SQLite or PostgreSQL: one SQL implementation, two connections.

`open_store("sqlite:///var/lib/topowatch/history.db")` is the single-replica default: a file,
no server. `open_store("postgresql://topowatch@db:5432/topowatch")` is for replicas that share
one history, or for history that should outlive the pod's volume. Both run the same statements
(qmark placeholders, rewritten to psycopg's `%s`), the same `ON CONFLICT` upserts and the same
keyset pages; only connecting, the column types (see migrations) and which errors mean "the
database is unavailable" differ.

Concurrency: the store holds ONE connection and a lock around every call. Its one writer is the
history writer's thread, in batches; reads are a few API requests at a time, each one indexed
page, so serialising them costs little and keeps one code path for both databases (an SQLite
connection shared across threads under the lock: `check_same_thread=False`). SQLite runs in WAL
mode with `synchronous=NORMAL`: a power cut may lose the last transactions but never corrupts
the file, and that is the durability history needs.

Failures a caller can wait out (PostgreSQL down or unreachable, the connection lost, SQLite's
disk full or file locked) raise `StoreUnavailable`, after a rollback, so the writer queues the
batch and retries; the writes are upserts, so a batch that did commit before the error is
harmless to write again. A PostgreSQL connection that failed is dropped and the next call
connects again, retrying once at once when a connection that had gone stale (the server
restarted since) fails. Messages never carry a password: URLs are shown through `redact`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from exporter.store import migrations
from exporter.store.records import (
    ADMISSION,
    AuditQuery,
    AuditRow,
    GoodputQuery,
    GoodputRow,
    Page,
    PreemptionQuery,
    PreemptionRow,
    Row,
    ScaleEventRow,
    WorkloadRow,
    decode_cursor,
    encode_cursor,
    merge_preemption,
    same_preemption,
)

T = TypeVar("T")

CONNECT_TIMEOUT_S = 5
SQLITE_BUSY_TIMEOUT_S = 5.0
# SQLite's primary result codes that mean "not now" rather than "wrong": busy, locked, I/O
# error, disk full, cannot open.
_SQLITE_UNAVAILABLE = {5, 6, 10, 13, 14}


class StoreUrlError(ValueError):
    """The store URL cannot be used as written."""


class StoreUnavailable(Exception):
    """The database cannot take or answer the call now; the same call may succeed later."""


def redact(url: str) -> str:
    """`url` with any password (in the user part or a `password=` parameter) replaced."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    userinfo, at, hostport = parts.netloc.rpartition("@")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not (at and ":" in userinfo) and all(k != "password" for k, _ in query):
        return url  # nothing to hide: shown as written
    netloc = parts.netloc
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
    hidden = [(k, "***" if k == "password" else v) for k, v in query]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(hidden, safe="*/")))


@dataclass(frozen=True)
class _Table:
    name: str
    row_type: type
    conflict: str  # the natural key the upsert matches on
    time_column: str  # what pages order by and retention ages by


_TABLES = (
    _Table("preemptions", PreemptionRow, "key", "time"),
    _Table("workloads", WorkloadRow, "uid", "finished_at"),
    _Table("audit", AuditRow, "digest", "time"),
    _Table("scale_events", ScaleEventRow, "key", "time"),
    _Table("goodput", GoodputRow, "key", "time"),
)
_TABLE_OF: dict[type, _Table] = {t.row_type: t for t in _TABLES}


def _json(document: dict[str, Any]) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def _columns(table: _Table) -> list[str]:
    names = [f.name for f in dataclasses.fields(table.row_type)]
    return ["digest", *names] if table.row_type is AuditRow else names


def _values(row: Row) -> list[Any]:
    values = [
        _json(v) if f.name == "document" else v
        for f in dataclasses.fields(row)
        for v in (getattr(row, f.name),)
    ]
    if isinstance(row, AuditRow):
        # Audit records have no natural key: the same record written twice has the same digest
        # (an empty `subject`, which migration 4 added, left out: digests stay as they were).
        fields = dataclasses.asdict(row)
        if not row.subject:
            del fields["subject"]
        return [hashlib.sha256(_json(fields).encode()).hexdigest(), *values]
    return values


def _upsert_sql(table: _Table) -> str:
    columns = _columns(table)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != table.conflict)
    return (
        f"INSERT INTO {table.name} ({', '.join(columns)})"
        f" VALUES ({', '.join('?' for _ in columns)})"
        f" ON CONFLICT ({table.conflict}) DO UPDATE SET {updates}"
    )


_UPSERT = {t.row_type: _upsert_sql(t) for t in _TABLES}
_PREEMPTION_COLUMNS = _columns(_TABLE_OF[PreemptionRow])
_UPDATE_PREEMPTION = (
    f"UPDATE preemptions SET {', '.join(f'{c} = ?' for c in _PREEMPTION_COLUMNS)} WHERE id = ?"
)
_VICTIMS_PER_QUERY = 500  # names in one IN (...): far below either database's parameter limit


def _preemption_from(columns: Sequence[Any]) -> PreemptionRow:
    """A row read back (the columns of `_PREEMPTION_COLUMNS`, in order)."""
    values = dict(zip(_PREEMPTION_COLUMNS, columns, strict=True))
    values["document"] = json.loads(values["document"])
    return PreemptionRow(**values)


class _Backend:
    """How to reach one database and tell its outages from its errors."""

    dialect: str
    begin: str  # starts a write transaction
    lock: str | None  # serialises migrations between processes, inside their transaction
    reconnects: bool  # whether a failed connection is dropped and made again
    shown: str  # the database, as messages name it

    def connect(self) -> Any:
        raise NotImplementedError

    def unavailable(self, exc: Exception) -> bool:
        raise NotImplementedError

    def errors(self) -> tuple[type[Exception], ...]:
        """The driver's base error classes (a failed rollback is one of these)."""
        raise NotImplementedError


class _SqliteBackend(_Backend):
    dialect = "sqlite"
    begin = "BEGIN IMMEDIATE"  # take the write lock now, not at the first write
    lock = None
    reconnects = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.shown = f"SQLite database {path}"

    def connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions, the store issues BEGIN/COMMIT itself
        # exactly as it does on PostgreSQL.
        conn = sqlite3.connect(
            self.path,
            timeout=SQLITE_BUSY_TIMEOUT_S,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def unavailable(self, exc: Exception) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(exc, sqlite3.OperationalError) and (
            code is None or code & 0xFF in _SQLITE_UNAVAILABLE
        )

    def errors(self) -> tuple[type[Exception], ...]:
        return (sqlite3.Error,)


class _PostgresBackend(_Backend):
    dialect = "postgresql"
    begin = "BEGIN"
    lock = "SELECT pg_advisory_xact_lock(7316028)"  # any constant all topowatch processes share
    reconnects = True

    def __init__(self, url: str, psycopg: Any) -> None:
        self.url = url
        self.psycopg = psycopg
        self.shown = f"PostgreSQL at {redact(url)}"
        given = dict(parse_qsl(urlsplit(url).query))
        self.options = {} if "connect_timeout" in given else {"connect_timeout": CONNECT_TIMEOUT_S}

    def connect(self) -> Any:
        return self.psycopg.connect(self.url, autocommit=True, **self.options)

    def unavailable(self, exc: Exception) -> bool:
        return isinstance(exc, self.psycopg.OperationalError | self.psycopg.InterfaceError)

    def errors(self) -> tuple[type[Exception], ...]:
        return (self.psycopg.Error,)


class SqlStore:
    """The history store; made by `open_store`, safe to share between threads."""

    def __init__(self, backend: _Backend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._conn: Any = None
        self._closed = False
        self._placeholder = "%s" if backend.dialect == "postgresql" else "?"

    # -- the interface

    def write(self, batch: Sequence[Row]) -> None:
        """Write every row of `batch` in one transaction: preemptions merged into the row of
        the same preemption (`_merge_preemptions`), the others upserted by their key."""
        groups: dict[type, list[list[Any]]] = {}
        preemptions: list[PreemptionRow] = []
        for row in batch:
            if type(row) not in _UPSERT:
                raise TypeError(f"not a history row: {type(row).__name__}")
            if isinstance(row, PreemptionRow):
                preemptions.append(row)
            else:
                groups.setdefault(type(row), []).append(_values(row))

        def work(cur: Any) -> None:
            if preemptions:
                self._merge_preemptions(cur, preemptions)
            for row_type, values in groups.items():
                cur.executemany(self._param(_UPSERT[row_type]), values)

        if groups or preemptions:
            self._run(lambda cur: self._transaction(cur, work))

    def preemptions(self, q: PreemptionQuery) -> Page:
        return self._page(q)

    def audit(self, q: AuditQuery) -> Page:
        return self._page(q)

    def goodput(self, q: GoodputQuery) -> Page:
        """One page of goodput records (exporter.cluster.goodput), newest first."""
        return self._page(q)

    def goodput_all(self, kind: str, since: float = 0.0) -> list[dict[str, Any]]:
        """Every goodput record of `kind` at time >= `since`, oldest first: what a restarted
        service rebuilds its ledger from (`GoodputBook.restore`)."""
        sql = self._param(
            "SELECT document FROM goodput WHERE kind = ? AND time >= ? ORDER BY time, id"
        )

        def work(cur: Any) -> list[dict[str, Any]]:
            cur.execute(sql, (kind, since))
            return [dict(json.loads(found[0])) for found in cur.fetchall()]

        return self._run(work)

    def workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The explain document of the newest-finished workload of that name, or None."""
        sql = self._param(
            "SELECT document FROM workloads WHERE namespace = ? AND name = ?"
            " ORDER BY finished_at DESC, id DESC LIMIT 1"
        )

        def work(cur: Any) -> dict[str, Any] | None:
            cur.execute(sql, (namespace, name))
            found = cur.fetchone()
            return None if found is None else dict(json.loads(found[0]))

        return self._run(work)

    def prune(self, now: float, max_age_s: float, max_rows: int) -> int:
        """Delete, from every table, rows older than `max_age_s` and all but the newest
        `max_rows`; the number deleted."""

        def work(cur: Any) -> int:
            deleted = 0
            for table in _TABLES:
                t = table.time_column
                cur.execute(
                    self._param(f"DELETE FROM {table.name} WHERE {t} < ?"), (now - max_age_s,)
                )
                deleted += max(cur.rowcount, 0)
                # The newest row past the bound: it and everything older goes.
                cur.execute(
                    self._param(
                        f"SELECT {t}, id FROM {table.name} ORDER BY {t} DESC, id DESC"
                        " LIMIT 1 OFFSET ?"
                    ),
                    (max_rows,),
                )
                cut = cur.fetchone()
                if cut is not None:
                    cur.execute(
                        self._param(
                            f"DELETE FROM {table.name} WHERE {t} < ? OR ({t} = ? AND id <= ?)"
                        ),
                        (cut[0], cut[0], cut[1]),
                    )
                    deleted += max(cur.rowcount, 0)
            return deleted

        return self._run(lambda cur: self._transaction(cur, work))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()

    # -- the machinery

    def _param(self, sql: str) -> str:
        """`sql`, written with qmarks, in the driver's placeholders."""
        return sql.replace("?", self._placeholder)

    def migrate(self) -> None:
        """Bring the schema to `migrations.LATEST` (see migrations); SchemaTooNew, untouched,
        when the database is newer."""
        dialect = self._backend.dialect

        def found(cur: Any) -> int:
            cur.execute(migrations.VERSION_TABLE_EXISTS[dialect])
            if cur.fetchone() is None:
                return 0
            cur.execute(migrations.CURRENT_VERSION)
            return int(cur.fetchone()[0])

        def apply(cur: Any, migration: migrations.Migration) -> None:
            if self._backend.lock is not None:
                cur.execute(self._backend.lock)
            cur.execute(migrations.render(migrations.CREATE_VERSION_TABLE, dialect))
            if found(cur) >= migration.version:
                return  # another process applied it while this one waited for the lock
            for statement in migration.statements:
                cur.execute(migrations.render(statement, dialect))
            cur.execute(
                self._param(migrations.RECORD_VERSION),
                (migration.version, migration.description, time.time()),
            )

        def migrate_one(migration: migrations.Migration) -> None:
            self._run(lambda cur: self._transaction(cur, lambda c: apply(c, migration)))

        for migration in migrations.pending(self._run(found)):
            migrate_one(migration)

    def _merge_preemptions(self, cur: Any, rows: Sequence[PreemptionRow]) -> None:
        """Each row merged into the stored (or earlier in this batch) row of the same
        preemption, else inserted. The candidates are read a few hundred victims a query, so
        a batch costs a handful of indexed reads, not one per row."""
        names = sorted({r.victim_name for r in rows})
        known: dict[tuple[str, str], list[list[Any]]] = {}  # victim -> [[id | None, row]]
        for start in range(0, len(names), _VICTIMS_PER_QUERY):
            chunk = names[start : start + _VICTIMS_PER_QUERY]
            cur.execute(self._param(victims_sql(len(chunk))), chunk)
            for found in cur.fetchall():
                stored = _preemption_from(found[1:])
                victim = (stored.victim_namespace, stored.victim_name)
                known.setdefault(victim, []).append([found[0], stored])
        changed: dict[int, list[Any]] = {}  # by id() of the entry, in first-changed order
        for row in rows:
            entries = known.setdefault((row.victim_namespace, row.victim_name), [])
            match = next((e for e in entries if e[1].key == row.key), None) or next(
                (e for e in entries if same_preemption(e[1], row)), None
            )
            if match is None:
                match = [None, row]
                entries.append(match)
            else:
                match[1] = merge_preemption(match[1], row)
            changed.setdefault(id(match), match)
        updates = [[*_values(e[1]), e[0]] for e in changed.values() if e[0] is not None]
        inserts = [_values(e[1]) for e in changed.values() if e[0] is None]
        if updates:
            cur.executemany(self._param(_UPDATE_PREEMPTION), updates)
        if inserts:
            cur.executemany(self._param(_UPSERT[PreemptionRow]), inserts)

    def _page(self, q: PreemptionQuery | AuditQuery | GoodputQuery) -> Page:
        sql, args = page_sql(q)

        def work(cur: Any) -> list[Any]:
            cur.execute(self._param(sql), args)
            return list(cur.fetchall())

        rows = self._run(work)
        items = tuple(dict(json.loads(document)) for _, _, document in rows[: q.limit])
        if len(rows) <= q.limit:
            return Page(items, None)
        row_id, at, _ = rows[q.limit - 1]
        return Page(items, encode_cursor(at, row_id))

    def _transaction(self, cur: Any, body: Callable[[Any], T]) -> T:
        cur.execute(self._backend.begin)
        try:
            result = body(cur)
            cur.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(*self._backend.errors()):
                cur.execute("ROLLBACK")  # may fail: the connection is gone, or SQLite rolled back
            raise
        return result

    def _run(self, work: Callable[[Any], T]) -> T:
        """`work(cursor)` under the lock, outages raised as StoreUnavailable."""
        with self._lock:
            if self._closed:
                raise StoreUnavailable(f"{self._backend.shown}: the store is closed")
            for attempt in range(2):
                stale = self._conn is not None
                try:
                    if self._conn is None:
                        self._conn = self._backend.connect()
                    return work(self._conn.cursor())
                except Exception as exc:
                    if not self._backend.unavailable(exc):
                        raise
                    if self._backend.reconnects:
                        self._drop()
                        if stale and attempt == 0:
                            continue  # the server restarted since: once more, connected anew
                    reason = " ".join(str(exc).split())
                    raise StoreUnavailable(
                        f"{self._backend.shown} is unavailable: {reason}"
                    ) from exc
            raise AssertionError("unreachable")  # the loop returns or raises

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(*self._backend.errors()):
                self._conn.close()
            self._conn = None


def victims_sql(names: int) -> str:
    """The stored preemptions of `names` victim names (qmark placeholders), for merging."""
    placeholders = ", ".join("?" for _ in range(names))
    columns = ", ".join(_PREEMPTION_COLUMNS)
    return f"SELECT id, {columns} FROM preemptions WHERE victim_name IN ({placeholders})"


def page_sql(q: PreemptionQuery | AuditQuery | GoodputQuery) -> tuple[str, list[Any]]:
    """The query (qmark placeholders) and parameters of one page of `q`: (id, time, document)
    rows newest first after the cursor, one more than the page so the store knows whether
    another follows. ValueError for a malformed cursor."""
    where, params = ["time >= ?"], list[Any]([q.since])
    either: list[tuple[str, str]] = []
    if isinstance(q, PreemptionQuery):
        table = "preemptions"
        if q.until is not None:
            where.append("time < ?")
            params.append(q.until)
        for column, value in (("victim_namespace", q.namespace), ("verdict", q.verdict)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if q.queue is not None:
            either = [("victim_cluster_queue", q.queue), ("preemptor_cluster_queue", q.queue)]
    elif isinstance(q, GoodputQuery):
        table = "goodput"
        for column, value in (("kind", q.kind), ("namespace", q.namespace), ("job", q.job)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
    else:
        table = "audit"
        if q.admission:
            where.append("kind = ?")
            params.append(ADMISSION)
            if q.workload is not None:
                where.append("subject = ?")
                params.append(q.workload)
        else:
            where.append("kind <> ?")
            params.append(ADMISSION)
        if q.node is not None:
            where.append("node = ?")
            params.append(q.node)
    if q.cursor is not None:
        # (time, id) < cursor, spelt so that the time bound alone is an index range.
        at, row_id = decode_cursor(q.cursor)
        where += ["time <= ?", "(time < ? OR id < ?)"]
        params += [at, at, row_id]
    select = f"SELECT id, time, document FROM {table} WHERE {' AND '.join(where)}"
    order = " ORDER BY time DESC, id DESC LIMIT ?"
    if not either:
        return select + order, [*params, q.limit + 1]
    # Either of two queues: a UNION of one index walk per queue, each stopping after a page,
    # where an OR would have the planner collect and sort every match first.
    parts, args = [], []
    for n, (column, value) in enumerate(either):
        parts.append(f"SELECT * FROM ({select} AND {column} = ?{order}) AS part{n}")
        args += [*params, value, q.limit + 1]
    return " UNION ".join(parts) + order, [*args, q.limit + 1]


def _backend_for(url: str) -> _Backend:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise StoreUrlError(f"malformed store URL {redact(url)}: {exc}") from None
    shown = redact(url)
    if parts.scheme == "sqlite":
        if parts.netloc:
            raise StoreUrlError(
                f"{shown}: an SQLite URL names no host; write sqlite:///absolute/path/to/file.db"
            )
        if parts.query or parts.fragment:
            raise StoreUrlError(f"{shown}: an SQLite URL takes no parameters")
        if not parts.path.strip("/") or parts.path.endswith("/"):
            raise StoreUrlError(f"{shown} names no database file: sqlite:///path/to/file.db")
        return _SqliteBackend(Path(parts.path))
    if parts.scheme in ("postgresql", "postgres"):
        query = dict(parse_qsl(parts.query))
        if not parts.hostname and "host" not in query:
            raise StoreUrlError(f"{shown} names no host: postgresql://user@host:port/database")
        database = parts.path.lstrip("/")
        if not database or "/" in database:
            raise StoreUrlError(f"{shown} names no database: postgresql://user@host:port/database")
        if port == 0:
            raise StoreUrlError(f"{shown}: port 0 is not a port")
        try:
            import psycopg  # only PostgreSQL users need it installed
        except ImportError:
            raise StoreUnavailable(
                f"{shown}: the PostgreSQL driver is not installed (pip install 'psycopg[binary]')"
            ) from None
        return _PostgresBackend(url, psycopg)
    raise StoreUrlError(
        f"{shown}: unsupported scheme {parts.scheme!r};"
        " use sqlite:///path/to/file.db or postgresql://user@host:port/database"
    )


def store_for(url: str) -> SqlStore:
    """The store at `url`, not yet connected nor migrated (`migrate` before use);
    StoreUrlError when the URL is malformed, StoreUnavailable when its driver is missing."""
    return SqlStore(_backend_for(url))


def open_store(url: str) -> SqlStore:
    """Connect to the store at `url` and bring its schema up to date.

    StoreUrlError when the URL is malformed, StoreUnavailable when the database cannot be
    reached or opened, migrations.SchemaTooNew when a newer topowatch migrated it."""
    store = store_for(url)
    try:
        store.migrate()
    except BaseException:
        store.close()
        raise
    return store
