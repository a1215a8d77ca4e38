"""The SQLite store's base tables, created on every open (`CREATE ... IF NOT
EXISTS`); what later versions add is `SqliteStore._migrate`'s, step by step
(as PostgreSQL's whole schema is `store_pg_schema.py`'s)."""

BASE_TABLES = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    d INTEGER NOT NULL, frac_bits INTEGER NOT NULL,
    n_max INTEGER NOT NULL, min_batch INTEGER NOT NULL,
    epsilon_total TEXT NOT NULL, delta_total TEXT NOT NULL, epsilon_min TEXT NOT NULL,
    n INTEGER NOT NULL DEFAULT 0,
    digest BLOB NOT NULL,
    sums BLOB NOT NULL,
    collection_open INTEGER NOT NULL DEFAULT 1,
    epsilon_spent TEXT NOT NULL DEFAULT '0',
    delta_spent TEXT NOT NULL DEFAULT '0',
    agreed INTEGER NOT NULL DEFAULT 0,
    validate_reports INTEGER NOT NULL DEFAULT 0,
    embedding TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS reports (
    task_id TEXT NOT NULL, report_id BLOB NOT NULL,
    share_off INTEGER,
    share_len INTEGER,
    PRIMARY KEY (task_id, report_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streams (
    stream_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    kind TEXT NOT NULL, epsilon TEXT NOT NULL, delta TEXT NOT NULL,
    gamma TEXT,
    state TEXT NOT NULL,
    chunks INTEGER NOT NULL DEFAULT 0,
    queries INTEGER NOT NULL DEFAULT 0,
    plan_id TEXT,
    plan_group INTEGER
);
-- task() counts a task's streams on every call: without this index that count
-- scanned every stream of every task (an index only: no schema version change).
CREATE INDEX IF NOT EXISTS streams_by_task ON streams (task_id, state);
-- A task with a validity circuit: the helper's Prio3 shares of each report
-- until the leader verifies its batch, and each verified batch's verdicts
-- (so that a retried verification answers the same); both dropped at the close.
CREATE TABLE IF NOT EXISTS pending (
    task_id TEXT NOT NULL, report_id BLOB NOT NULL, blob BLOB NOT NULL,
    PRIMARY KEY (task_id, report_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS verdicts (
    task_id TEXT NOT NULL, batch_id BLOB NOT NULL, verdicts BLOB NOT NULL,
    PRIMARY KEY (task_id, batch_id)
) WITHOUT ROWID;
"""
