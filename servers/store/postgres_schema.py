"""The PostgreSQL store's schema (`store_pg.PgStore`), as the migrations that
build it: versioned in the `svtagg_schema` table (its own numbering, from 1;
not SQLite's); `MIGRATIONS[v]` brings a store at version v to v + 1, and
`PgStore` runs the steps a store lacks in one transaction under its lock.
"""

from __future__ import annotations


def _final_states(table: str, noun: str, key: str, final: tuple[str, str]) -> tuple[str, str]:
    """A trigger function and trigger refusing to move a row of `table` out of
    one of its `final` states."""
    return (
        f"""CREATE FUNCTION svtagg_final_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF OLD.state IN ('{final[0]}', '{final[1]}') AND NEW.state <> OLD.state THEN
            RAISE EXCEPTION '{noun} % is %; its state is final', OLD.{key}, OLD.state;
        END IF;
        RETURN NEW;
    END $$""",
        f"""CREATE TRIGGER {table}_final BEFORE UPDATE ON {table}
        FOR EACH ROW EXECUTE FUNCTION svtagg_final_{table}()""",
    )


_V1 = (
    """CREATE TABLE tasks (
        task_id TEXT COLLATE "C" PRIMARY KEY,
        d INTEGER NOT NULL CHECK (d > 0), frac_bits INTEGER NOT NULL,
        n_max BIGINT NOT NULL, min_batch BIGINT NOT NULL,
        epsilon_total TEXT NOT NULL, delta_total TEXT NOT NULL, epsilon_min TEXT NOT NULL,
        n BIGINT NOT NULL DEFAULT 0 CHECK (n >= 0 AND n <= n_max),
        digest BYTEA NOT NULL,
        sums BYTEA NOT NULL,
        collection_open INTEGER NOT NULL DEFAULT 1,
        epsilon_spent TEXT NOT NULL DEFAULT '0',
        delta_spent TEXT NOT NULL DEFAULT '0',
        agreed INTEGER NOT NULL DEFAULT 0,
        validate_reports INTEGER NOT NULL DEFAULT 0,
        robust_sums BYTEA
    )""",
    """CREATE TABLE reports (
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        report_id BYTEA NOT NULL,
        share BYTEA,
        PRIMARY KEY (task_id, report_id)
    )""",
    """CREATE TABLE streams (
        seq BIGSERIAL NOT NULL UNIQUE,
        stream_id TEXT COLLATE "C" PRIMARY KEY,
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        kind TEXT NOT NULL, epsilon TEXT NOT NULL, delta TEXT NOT NULL,
        gamma TEXT,
        state TEXT NOT NULL
            CHECK (state IN ('opening', 'open', 'in_chunk', 'closed', 'failed')),
        chunks BIGINT NOT NULL DEFAULT 0,
        queries BIGINT NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX streams_task_state ON streams (task_id, state)",
    """CREATE TABLE plans (
        plan_id TEXT COLLATE "C" PRIMARY KEY,
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        book TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('active', 'ended', 'failed'))
    )""",
    """CREATE TABLE spends (
        seq BIGSERIAL PRIMARY KEY,
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        epsilon TEXT NOT NULL, delta TEXT NOT NULL,
        epsilon_spent TEXT NOT NULL, delta_spent TEXT NOT NULL,
        at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    """CREATE FUNCTION svtagg_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'table % is append-only', TG_TABLE_NAME;
    END $$""",
    """CREATE TRIGGER spends_append_only BEFORE UPDATE OR DELETE ON spends
        FOR EACH ROW EXECUTE FUNCTION svtagg_append_only()""",
    """CREATE TRIGGER spends_no_truncate BEFORE TRUNCATE ON spends
        FOR EACH STATEMENT EXECUTE FUNCTION svtagg_append_only()""",
    *_final_states("streams", "stream", "stream_id", ("closed", "failed")),
)

#: Version 2: the embedding the task's clients use ("" = not recorded).
_V2: tuple[str, ...] = ("ALTER TABLE tasks ADD COLUMN embedding TEXT NOT NULL DEFAULT ''",)

#: Version 3: leased comparison work (`servers/work.py`) and the helper's
#: robust-aggregate shares staged between the close's passes and MarkAgreed
#: (in the database, so that any process of the server may run a pass).
_V3: tuple[str, ...] = (
    """CREATE TABLE work (
        job_id BIGSERIAL PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('ask', 'compare', 'robust', 'validate')),
        stream_id TEXT COLLATE "C",
        payload BYTEA NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending'
            CHECK (state IN ('pending', 'leased', 'done', 'failed')),
        owner TEXT,
        lease_until TIMESTAMPTZ,
        result BYTEA,
        error BYTEA,
        created TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    # At most one chunk of a stream queued or running, whichever front end took it.
    """CREATE UNIQUE INDEX work_one_per_stream ON work (stream_id)
        WHERE state IN ('pending', 'leased')""",
    "CREATE INDEX work_pending ON work (job_id) WHERE state = 'pending'",
    *_final_states("work", "job", "job_id", ("done", "failed")),
    "CREATE TABLE workers (owner TEXT PRIMARY KEY, role TEXT NOT NULL, seen TIMESTAMPTZ NOT NULL)",
    """CREATE TABLE robust_staged (
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        digest BYTEA NOT NULL,
        lo INTEGER NOT NULL CHECK (lo >= 0),
        hi INTEGER NOT NULL CHECK (hi > lo),
        shares BYTEA NOT NULL,
        PRIMARY KEY (task_id, lo)
    )""",
)

#: Version 4: "every report belongs to a task" checked once per statement, not
#: once per row.  The foreign key reports.task_id -> tasks ran one SPI query per
#: inserted report (about a third of the database's CPU per upload batch); it
#: is replaced by triggers that enforce the same rule:
#: - after each INSERT statement on `reports`, the distinct task ids of the new
#:   rows are locked FOR KEY SHARE in `tasks` (as the foreign key locks them)
#:   and a missing one fails the statement with foreign_key_violation;
#: - an UPDATE of `reports.task_id` is checked row by row in the same way (no
#:   code path does it; `mark_agreed`'s UPDATE of `share` does not fire it);
#: - a DELETE of a task, or a change of its task_id, that still has reports
#:   fails with foreign_key_violation (NO ACTION, as the foreign key did).
#: Self-contained: it drops only the constraint V1 created and adds only
#: objects named svtagg_reports_* / reports_task_*.
_V4: tuple[str, ...] = (
    "ALTER TABLE reports DROP CONSTRAINT reports_task_id_fkey",
    """CREATE FUNCTION svtagg_reports_task_exists() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        wanted BIGINT;
        locked BIGINT;
    BEGIN
        SELECT count(DISTINCT task_id) INTO wanted FROM added;
        SELECT count(*) INTO locked FROM (
            SELECT 1 FROM tasks t WHERE t.task_id IN (SELECT task_id FROM added)
            FOR KEY SHARE OF t
        ) present;
        IF locked <> wanted THEN
            RAISE EXCEPTION 'reports of a task that does not exist'
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER reports_task_inserted AFTER INSERT ON reports
        REFERENCING NEW TABLE AS added
        FOR EACH STATEMENT EXECUTE FUNCTION svtagg_reports_task_exists()""",
    """CREATE FUNCTION svtagg_reports_task_moved() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM tasks t WHERE t.task_id = NEW.task_id FOR KEY SHARE OF t;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'report moved to task %, which does not exist', NEW.task_id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER reports_task_updated AFTER UPDATE OF task_id ON reports
        FOR EACH ROW WHEN (OLD.task_id IS DISTINCT FROM NEW.task_id)
        EXECUTE FUNCTION svtagg_reports_task_moved()""",
    """CREATE FUNCTION svtagg_reports_task_kept() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM reports r WHERE r.task_id = OLD.task_id) THEN
            RAISE EXCEPTION 'task % still has reports', OLD.task_id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER reports_task_deleted AFTER DELETE ON tasks
        FOR EACH ROW EXECUTE FUNCTION svtagg_reports_task_kept()""",
    """CREATE TRIGGER reports_task_renamed AFTER UPDATE OF task_id ON tasks
        FOR EACH ROW WHEN (OLD.task_id IS DISTINCT FROM NEW.task_id)
        EXECUTE FUNCTION svtagg_reports_task_kept()""",
)

#: Version 5: the plan group a stream was charged to (reconciliation replays it
#: there; NULL: the task's ledger), and the robust-aggregate pass each staged
#: share belongs to (a late chunk of an abandoned pass stages apart and is never
#: taken by a newer pass).  Shares staged before carry no pass: they are dropped,
#: and a close that was in progress runs its pass again.
_V5: tuple[str, ...] = (
    'ALTER TABLE streams ADD COLUMN plan_id TEXT COLLATE "C"',
    "ALTER TABLE streams ADD COLUMN plan_group INTEGER CHECK (plan_group >= 0)",
    "DELETE FROM robust_staged",
    "ALTER TABLE robust_staged ADD COLUMN pass_id BYTEA NOT NULL",
    "ALTER TABLE robust_staged DROP CONSTRAINT robust_staged_pkey",
    "ALTER TABLE robust_staged ADD PRIMARY KEY (task_id, pass_id, lo)",
)

#: Version 6: validity proofs — the task's circuit, its Prio3 verify key and
#: the count of refused reports by reason; the helper's pending Prio3 shares
#: (until the leader verifies their batch) and each verified batch's verdicts
#: (so a retried verification answers the same), both dropped at the close.
#: The garbled range check is retired: its leased jobs ('validate') go.
_V6: tuple[str, ...] = (
    "DELETE FROM work WHERE kind = 'validate'",
    "ALTER TABLE work DROP CONSTRAINT work_kind_check",
    "ALTER TABLE work ADD CONSTRAINT work_kind_check CHECK (kind IN ('ask', 'compare', 'robust'))",
    "ALTER TABLE tasks ADD COLUMN validity TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE tasks ADD COLUMN verify_key BYTEA",
    "ALTER TABLE tasks ADD COLUMN rejected TEXT NOT NULL DEFAULT '{}'",
    """CREATE TABLE pending (
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        report_id BYTEA NOT NULL,
        blob BYTEA NOT NULL,
        PRIMARY KEY (task_id, report_id)
    )""",
    """CREATE TABLE verdicts (
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        batch_id BYTEA NOT NULL,
        verdicts BYTEA NOT NULL,
        PRIMARY KEY (task_id, batch_id)
    )""",
)

#: Version 7: report-noisy-max chunks run as leased jobs too ('nmax').
_V7: tuple[str, ...] = (
    "ALTER TABLE work DROP CONSTRAINT work_kind_check",
    "ALTER TABLE work ADD CONSTRAINT work_kind_check "
    "CHECK (kind IN ('ask', 'compare', 'robust', 'nmax'))",
)

#: Version 8: the task's noise option (tasks stored before: independent).
_V8: tuple[str, ...] = (
    "ALTER TABLE tasks ADD COLUMN noise TEXT NOT NULL DEFAULT 'independent'"
    " CHECK (noise IN ('independent', 'joint'))",
)

#: Version 9: a chunked report-noisy-max's carried winner (this server's
#: share) and the chunk that stored it.
_V9: tuple[str, ...] = (
    "ALTER TABLE streams ADD COLUMN carry_chunk BIGINT",
    "ALTER TABLE streams ADD COLUMN carry BYTEA",
)

#: Version 10: ahead-of-time joint noise — each stream's pool counters and the
#: batches of this server's shares it holds (servers/store/jointpool.py); the work
#: table admits the batch's chunk kind ('noise', run by the front end today).
_V10: tuple[str, ...] = (
    "ALTER TABLE work DROP CONSTRAINT work_kind_check",
    "ALTER TABLE work ADD CONSTRAINT work_kind_check "
    "CHECK (kind IN ('ask', 'compare', 'robust', 'nmax', 'noise'))",
    """CREATE TABLE joint_pools (
        stream_id TEXT COLLATE "C" PRIMARY KEY REFERENCES streams (stream_id),
        next_seq BIGINT NOT NULL DEFAULT 0,
        used_seq BIGINT NOT NULL DEFAULT 0,
        gamma_ready BOOLEAN NOT NULL DEFAULT FALSE
    )""",
    """CREATE TABLE joint_batches (
        stream_id TEXT COLLATE "C" NOT NULL REFERENCES streams (stream_id),
        lo BIGINT NOT NULL,
        shares BYTEA NOT NULL,
        PRIMARY KEY (stream_id, lo)
    )""",
)

#: Version 11: a verified batch's verdicts bound to the leader's prep shares
#: they were decided on (`store.Verified.binding`): a retry that changed them
#: is refused (rows recorded before hold NULL, and no retry of those is taken).
_V11: tuple[str, ...] = ("ALTER TABLE verdicts ADD COLUMN binding BYTEA",)

#: `MIGRATIONS[v]` brings a store at version v to v + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    _V1,
    _V2,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _V8,
    _V9,
    _V10,
    _V11,
)
