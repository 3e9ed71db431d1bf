"""Bad state files: every one raises StoreCorruptError naming the file, and no byte changes.

The other half: damage a crash can cause by itself (a torn last journal line, a stale temp
file) is recovered from silently and safely.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from aiqsim.core.states import transition
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores import JsonFileStore, SqliteStore, StoreCorruptError, StoreWriteError


def task(n: int, key: str | None = None) -> TaskRecord:
    return TaskRecord(
        id=f"t{n}", key=key or f"k{n}", kind="llm", provider="llm", payload={"n": n, "pad": "x" * 50}
    )


def populate(store: JsonFileStore | SqliteStore, count: int = 30) -> None:
    for n in range(count):
        store.insert_and_claim(task(n))
        if n % 2 == 0:
            running = transition(task(n), TaskStatus.RUNNING, 1.0)
            store.update(running)
            store.update(transition(running, TaskStatus.SUCCEEDED, 2.0, result={"n": n}))
    store.record_poison("k-poison", "SchemaViolationError: bad", 3.0)


def snapshot_of(directory: Path) -> dict[str, bytes]:
    """Every file's bytes, lock files aside (the lock is not state)."""
    return {
        p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file() and p.suffix != ".lock"
    }


def assert_refused_untouched(directory: Path, opener: Callable[[], object], *fragments: str) -> None:
    before = snapshot_of(directory)
    with pytest.raises(StoreCorruptError) as raised:
        opener()
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, message
    assert snapshot_of(directory) == before


# ============================================================================ JSON
@pytest.fixture
def json_path(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.json"
    with JsonFileStore(path, fsync=False) as store:  # durability of the setup is not under test
        populate(store)
        store.compact()
    return path


def read_document(path: Path) -> dict:
    """The snapshot as one flat dict (a version-2 file's ``store`` fields lifted to the top)."""
    doc = json.loads(path.read_text())
    if doc.get("version") == 2:
        return {"format": doc["format"], "version": 2, **doc["store"]}
    return doc


def write_document(path: Path, view: dict) -> None:
    """Write ``view`` back: version 2 in its checksummed layout (a valid seal), anything else plainly."""
    if view.get("version") != 2:
        path.write_text(json.dumps(view))
        return
    body = json.dumps(
        {k: v for k, v in view.items() if k not in ("format", "version")}, separators=(",", ":")
    )
    head = json.dumps(view["format"]).encode()
    path.write_bytes(
        b'{"format":%b,"version":2,"crc":"%08x","store":%b}\n'
        % (head, zlib.crc32(body.encode()), body.encode())
    )


def edit_document(path: Path, change: Callable[[dict], None]) -> None:
    """Change the snapshot's content and re-seal it, so what is refused is the content itself."""
    doc = read_document(path)
    change(doc)
    write_document(path, doc)


def test_json_intact_file_opens(json_path: Path) -> None:
    with JsonFileStore(json_path) as store:
        assert len(store) == 30 and store.poison_error("k-poison") == "SchemaViolationError: bad"


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "not valid JSON"),
        (lambda p: p.write_bytes(b""), "empty file"),
        (lambda p: p.write_bytes(b"\xff\xfe garbage"), "not valid JSON"),
        (lambda p: p.write_text("[1, 2, 3]"), "not an aiqsim task store"),
        (lambda p: edit_document(p, lambda d: d.update(format="something-else")), "not an aiqsim task store"),
        (lambda p: edit_document(p, lambda d: d.update(version=3)), "newer aiqsim"),
        (lambda p: edit_document(p, lambda d: d.update(version="1")), "unsupported version '1'"),
        (lambda p: edit_document(p, lambda d: d.pop("owners")), "'owners'"),
        (lambda p: edit_document(p, lambda d: d["tasks"][3].update(status="done")), "invalid status 'done'"),
        (lambda p: edit_document(p, lambda d: d["tasks"][3].update(id=17)), "field 'id'"),
        (lambda p: edit_document(p, lambda d: d["tasks"][3].update(priority=9)), "invalid priority 9"),
        (lambda p: edit_document(p, lambda d: d["tasks"][3].update(attempts=-1)), "'attempts'"),
        (lambda p: edit_document(p, lambda d: d["tasks"][3].pop("created_at")), "'created_at'"),
        (lambda p: edit_document(p, lambda d: d["tasks"].append(d["tasks"][0])), "appears twice"),
        (lambda p: edit_document(p, lambda d: d["owners"].update(k1="nobody")), "owned by 'nobody'"),
        (lambda p: edit_document(p, lambda d: d["poison"].update(x="not an object")), "invalid poison entry"),
    ],
    ids=[
        "truncated",
        "empty",
        "binary",
        "not-an-object",
        "wrong-format",
        "newer-version",
        "version-as-text",
        "missing-owners",
        "invalid-status",
        "id-not-text",
        "invalid-priority",
        "negative-attempts",
        "missing-field",
        "duplicate-id",
        "dangling-owner",
        "bad-poison",
    ],
)
def test_json_bad_snapshot_is_refused_untouched(
    json_path: Path, damage: Callable[[Path], None], expected: str
) -> None:
    damage(json_path)
    assert_refused_untouched(json_path.parent, lambda: JsonFileStore(json_path), str(json_path), expected)


def test_json_unreadable_snapshot_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    path.mkdir()  # tests run as root here, so a directory stands in for an unreadable file
    assert_refused_untouched(tmp_path, lambda: JsonFileStore(path), str(path), "cannot be read")


def test_json_refusal_releases_the_lock(json_path: Path) -> None:
    good = json_path.read_bytes()
    json_path.write_bytes(b"{")
    with pytest.raises(StoreCorruptError):
        JsonFileStore(json_path)
    json_path.write_bytes(good)  # the operator repairs the file
    with JsonFileStore(json_path) as store:
        assert len(store) == 30


# ---------------------------------------------------------------------------- journal
@pytest.fixture
def journaled(tmp_path: Path) -> Path:
    """A store whose last five writes live only in the journal."""
    path = tmp_path / "tasks.json"
    with JsonFileStore(path) as store:
        populate(store, 10)
        store.compact()
        for n in range(10, 15):
            store.insert_and_claim(task(n))
    assert path.with_name("tasks.json.journal").read_bytes().count(b"\n") == 5
    return path


def journal_lines(path: Path) -> list[bytes]:
    return path.with_name(path.name + ".journal").read_bytes().splitlines(keepends=True)


def write_journal(path: Path, lines: list[bytes]) -> None:
    path.with_name(path.name + ".journal").write_bytes(b"".join(lines))


def journal_line(entry: dict) -> bytes:
    body = json.dumps(entry, separators=(",", ":")).encode()
    return b'{"crc":"%08x","entry":%b}\n' % (zlib.crc32(body), body)


def test_json_journal_replays_on_open(journaled: Path) -> None:
    with JsonFileStore(journaled) as store:
        assert [r.id for r in store.list_by_status()] == [f"t{n}" for n in range(15)]
        assert not store.torn_tail_recovered


@pytest.mark.parametrize("cut", [1, 10, -2], ids=["one-byte", "mid-line", "no-newline"])
def test_json_torn_last_line_is_ignored_and_cut(journaled: Path, cut: int) -> None:
    lines = journal_lines(journaled)
    write_journal(journaled, [*lines[:-1], lines[-1][:cut]])
    with JsonFileStore(journaled) as store:
        assert store.torn_tail_recovered
        assert [r.id for r in store.list_by_status()] == [f"t{n}" for n in range(14)]  # t14 was torn
        assert journal_lines(journaled) == lines[:-1]  # the torn bytes are gone
        store.insert_and_claim(task(99))  # appends cleanly after the cut
    with JsonFileStore(journaled) as store:
        assert not store.torn_tail_recovered
        assert [r.id for r in store.list_by_status()][-2:] == ["t13", "t99"]


def test_json_zero_filled_tail_after_whole_lines_is_torn(journaled: Path) -> None:
    """Zeros after the last newline (a size extended, its data never written) are a torn append."""
    lines = journal_lines(journaled)
    write_journal(journaled, [*lines, b"\0" * 64])
    with JsonFileStore(journaled) as store:
        assert store.torn_tail_recovered
        assert len(store) == 15
    assert journal_lines(journaled) == lines


def test_json_garbled_whole_last_line_before_a_zero_tail_is_refused(journaled: Path) -> None:
    lines = journal_lines(journaled)
    garbled = lines[-1].replace(b"t14", b"t41")  # complete line, checksum no longer matches
    write_journal(journaled, [*lines[:-1], garbled, b"\0" * 64])
    assert_refused_untouched(journaled.parent, lambda: JsonFileStore(journaled), "journal", "line 5")


def test_json_damaged_middle_line_is_corruption(journaled: Path) -> None:
    lines = journal_lines(journaled)
    lines[1] = lines[1].replace(b"t11", b"t77")
    write_journal(journaled, lines)
    assert_refused_untouched(
        journaled.parent, lambda: JsonFileStore(journaled), "journal", "line 2", "checksum"
    )


def test_json_journal_sequence_gap_is_corruption(journaled: Path) -> None:
    lines = journal_lines(journaled)
    del lines[2]
    write_journal(journaled, lines)
    assert_refused_untouched(journaled.parent, lambda: JsonFileStore(journaled), "journal", "sequence")


def test_json_journal_entry_that_contradicts_the_snapshot_is_corruption(journaled: Path) -> None:
    last_seq = read_document(journaled)["last_seq"]
    bogus = {"seq": last_seq + 6, "op": "update", "task": {**task(500).to_dict()}}
    write_journal(
        journaled, [*journal_lines(journaled), journal_line(bogus), journal_line({**bogus, "seq": 0})]
    )
    assert_refused_untouched(
        journaled.parent, lambda: JsonFileStore(journaled), "update of unknown task 't500'"
    )


def test_json_journal_entry_with_invalid_record_is_corruption(journaled: Path) -> None:
    last_seq = read_document(journaled)["last_seq"]
    bad = {"seq": last_seq + 6, "op": "update", "task": {**task(3).to_dict(), "status": "exploded"}}
    write_journal(journaled, [*journal_lines(journaled), journal_line(bad), journal_line({**bad, "seq": 0})])
    assert_refused_untouched(journaled.parent, lambda: JsonFileStore(journaled), "invalid status 'exploded'")


@pytest.mark.parametrize(
    ("field", "value"),
    [("status", []), ("priority", {}), ("status", {"a": 1})],
    ids=["list", "dict", "object"],
)
def test_json_journal_entry_with_an_unhashable_field_is_corruption(
    journaled: Path, field: str, value: object
) -> None:
    """Before: a CRC-valid hand edit that put a list or an object where a status or a priority
    goes raised a raw TypeError (unhashable type) instead of refusing the file (review)."""
    last_seq = read_document(journaled)["last_seq"]
    bad = {"seq": last_seq + 6, "op": "update", "task": {**task(3).to_dict(), field: value}}
    write_journal(journaled, [*journal_lines(journaled), journal_line(bad), journal_line({**bad, "seq": 0})])
    assert_refused_untouched(journaled.parent, lambda: JsonFileStore(journaled), f"invalid {field}")


def test_json_journal_entry_whose_key_is_no_unicode_text_is_corruption(journaled: Path) -> None:
    """Before: a key spelt with a lone surrogate escape ("\\ud800x") opened, and compact() and
    purge() then failed on a record they could not write back (review)."""
    last_seq = read_document(journaled)["last_seq"]
    bad = {"seq": last_seq + 6, "op": "update", "task": {**task(3).to_dict(), "key": "\ud800x"}}
    write_journal(journaled, [*journal_lines(journaled), journal_line(bad), journal_line({**bad, "seq": 0})])
    assert_refused_untouched(journaled.parent, lambda: JsonFileStore(journaled), "not valid Unicode text")


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("payload", {"input": ["ok", {"text": "x\ud800"}]}, "'payload'['input'][1]['text']"),
        ("payload", {"\udfffkey": 1}, "'payload' (a key)"),
        ("result", {"output": "\udc80"}, "'result'['output']"),
        ("error", "boom \ud800", "'error'"),
    ],
)
def test_json_journal_entry_holding_no_unicode_text_anywhere_is_corruption(
    journaled: Path, field: str, value: object, where: str
) -> None:
    """Before: a lone surrogate escape inside a payload, a result or an error opened, and the next
    compaction failed with UnstorableValueError on a record it could not write back (review)."""
    last_seq = read_document(journaled)["last_seq"]
    bad = {"seq": last_seq + 6, "op": "update", "task": {**task(3).to_dict(), field: value}}
    write_journal(journaled, [*journal_lines(journaled), journal_line(bad), journal_line({**bad, "seq": 0})])
    assert_refused_untouched(
        journaled.parent, lambda: JsonFileStore(journaled), f"field {where} is not valid Unicode text"
    )


def test_json_journal_entry_with_an_unhashable_op_is_corruption(journaled: Path) -> None:
    last_seq = read_document(journaled)["last_seq"]
    bad = {"seq": last_seq + 6, "op": [], "task": task(3).to_dict()}
    write_journal(journaled, [*journal_lines(journaled), journal_line(bad), journal_line({**bad, "seq": 0})])
    with pytest.raises(StoreCorruptError):
        JsonFileStore(journaled)


def test_json_journal_without_snapshot_is_corruption(journaled: Path) -> None:
    journaled.unlink()
    assert_refused_untouched(journaled.parent, lambda: JsonFileStore(journaled), "snapshot", "missing")


def test_json_stale_temp_file_is_ignored_and_removed(json_path: Path) -> None:
    stale = json_path.with_name(f".{json_path.name}.tmp-424242")
    stale.write_bytes(b'{"format": "aiqsim-taskstore", "version": 1, "tasks": [')  # a crash mid-snapshot
    with JsonFileStore(json_path) as store:
        assert store.stale_temp_files_removed == 1
        assert len(store) == 30
    assert not stale.exists()


def test_json_store_survives_a_crash_in_a_real_process(tmp_path: Path) -> None:
    """A process that dies (os._exit, no close) leaves a store the next process opens whole."""
    path = tmp_path / "tasks.json"
    script = (
        "import os, sys\n"
        "from aiqsim.core.task import TaskRecord\n"
        "from aiqsim.stores import JsonFileStore\n"
        "store = JsonFileStore(sys.argv[1], compact_min_entries=7)\n"
        "for n in range(20):\n"
        "    store.insert_and_claim(TaskRecord(id=f't{n}', key=f'k{n}', kind='llm', provider='llm'))\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True)
    with JsonFileStore(path) as store:
        assert [r.id for r in store.list_by_status()] == [f"t{n}" for n in range(20)]


# ============================================================================ SQLite
@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A 200-task store file, built once (unsynced: its durability is not under test here)."""
    path = tmp_path_factory.mktemp("template") / "tasks.sqlite"
    with SqliteStore(path, synchronous="OFF") as store:
        populate(store, 200)
    assert not path.with_name("tasks.sqlite-wal").exists()  # checkpointed on close: the file is whole
    return path.read_bytes()


@pytest.fixture
def sqlite_path(tmp_path: Path, sqlite_template: bytes) -> Path:
    path = tmp_path / "tasks.sqlite"
    path.write_bytes(sqlite_template)
    path.chmod(0o600)
    return path


def hand_edit(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def test_sqlite_intact_file_opens(sqlite_path: Path) -> None:
    with SqliteStore(sqlite_path) as store:
        assert len(store) == 200 and store.poison_error("k-poison") == "SchemaViolationError: bad"


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: p.write_text("id,status\nt1,queued\n"), "not an SQLite database"),
        (lambda p: p.write_bytes(b""), "empty file"),
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "truncated"),
        (lambda p: p.write_bytes(p.read_bytes()[:4096]), "truncated"),
        (lambda p: p.write_bytes(p.read_bytes()[:50]), "truncated: 50 bytes"),
        (lambda p: hand_edit(p, "PRAGMA user_version = 7"), "schema version 7 (written by a newer aiqsim)"),
        (lambda p: hand_edit(p, "PRAGMA user_version = 0"), "schema version 0"),
        (lambda p: hand_edit(p, "UPDATE tasks SET status = 'done' WHERE id = 't5'"), "invalid status 'done'"),
        (lambda p: hand_edit(p, "UPDATE tasks SET priority = 4 WHERE id = 't5'"), "invalid priority 4"),
        (lambda p: hand_edit(p, "UPDATE tasks SET created_at = 'noon' WHERE id = 't5'"), "'created_at'"),
        (lambda p: hand_edit(p, "UPDATE tasks SET payload = '{not json' WHERE id = 't5'"), "is not JSON"),
        (lambda p: hand_edit(p, "UPDATE keys SET owner_id = 'ghost' WHERE key = 'k5'"), "owned by 'ghost'"),
        (
            lambda p: hand_edit(p, """UPDATE tasks SET payload = '{"a": ["\\ud800"]}' WHERE id = 't5'"""),
            "field 'payload'['a'][0] is not valid Unicode text",
        ),
        (lambda p: hand_edit(p, "DROP TABLE poison"), "table 'poison'"),
        (lambda p: hand_edit(p, "ALTER TABLE tasks ADD COLUMN extra TEXT"), "table 'tasks'"),
    ],
    ids=[
        "csv-file",
        "empty",
        "truncated-half",
        "truncated-to-one-page",
        "truncated-header",
        "newer-user-version",
        "zero-user-version",
        "invalid-status",
        "invalid-priority",
        "text-timestamp",
        "payload-not-json",
        "dangling-owner",
        "payload-lone-surrogate",
        "missing-table",
        "extra-column",
    ],
)
def test_sqlite_bad_file_is_refused_untouched(
    sqlite_path: Path, damage: Callable[[Path], None], expected: str
) -> None:
    damage(sqlite_path)
    assert_refused_untouched(sqlite_path.parent, lambda: SqliteStore(sqlite_path), str(sqlite_path), expected)


def test_sqlite_unreadable_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    path.mkdir()
    assert_refused_untouched(
        tmp_path, lambda: SqliteStore(path), str(path), "is a directory, not a regular file"
    )


@pytest.mark.parametrize("side", ["", "-wal"])
def test_a_fifo_as_the_store_or_its_wal_is_refused_not_waited_on(sqlite_path: Path, side: str) -> None:
    """open() on a FIFO waits for a writer: SqliteStore hung for ever on one."""
    target = Path(f"{sqlite_path}{side}")
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    assert_refused_untouched(
        sqlite_path.parent, lambda: SqliteStore(sqlite_path), "is a FIFO, not a regular file"
    )


def test_a_rollback_journal_beside_the_store_is_refused_and_kept(sqlite_path: Path) -> None:
    """The store writes in WAL mode and leaves no -journal; SQLite deleted (or played back) one found
    beside it on the first read, so whatever another program left there was gone."""
    Path(f"{sqlite_path}-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + bytes(504))
    assert_refused_untouched(sqlite_path.parent, lambda: SqliteStore(sqlite_path), "rollback journal")


@pytest.mark.parametrize(
    ("rebuild", "expected"),
    [
        (
            "ALTER TABLE keys RENAME TO keys_old; CREATE TABLE keys (key TEXT, owner_id TEXT); "
            "INSERT INTO keys SELECT * FROM keys_old; DROP TABLE keys_old",
            "table 'keys': column 'key' is neither its primary key nor unique",
        ),
        (
            "ALTER TABLE tasks RENAME TO tasks_old; CREATE VIEW tasks AS SELECT * FROM tasks_old",
            "'tasks' is a view, not a table",
        ),
    ],
    ids=["keys-without-primary-key", "tasks-as-a-view"],
)
def test_a_store_rebuilt_without_its_constraints_is_refused_untouched(
    sqlite_path: Path, rebuild: str, expected: str
) -> None:
    """Right table and column names, no uniqueness: it opened, was switched to WAL (its bytes
    changed), and every claim then failed with a raw SQL error inside a StoreWriteError; a keys
    table without its primary key could not keep a key to one run."""
    conn = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.executescript(f"BEGIN; {rebuild}; COMMIT;")
    finally:
        conn.close()
    assert_refused_untouched(sqlite_path.parent, lambda: SqliteStore(sqlite_path), expected, "left untouched")


def test_sqlite_invalid_row_read_later_is_still_reported(sqlite_path: Path) -> None:
    """With the open-time scan off, a bad row is caught when it is read, never half-decoded."""
    hand_edit(sqlite_path, "UPDATE tasks SET status = 'zombie' WHERE id = 't7'")
    with SqliteStore(sqlite_path, validate=False) as store:
        assert store.get("t6") is not None
        with pytest.raises(StoreCorruptError, match="invalid status 'zombie'"):
            store.get("t7")
        with pytest.raises(StoreCorruptError, match=str(sqlite_path)):
            store.list_by_status()


def test_sqlite_stale_creation_temp_of_a_dead_process_is_removed(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".tasks.sqlite.tmp-{int(dead.stdout)}-abc"
    stale.write_bytes(b"")
    with SqliteStore(tmp_path / "tasks.sqlite") as store:
        assert len(store) == 0
    assert not stale.exists()


def test_json_hand_edited_last_line_is_refused_not_cut_off(journaled: Path) -> None:
    """A whole, well-formed last line with a wrong checksum is an edit, not a crash: refuse it."""
    lines = journal_lines(journaled)
    edited = lines[-1].replace(b"t14", b"t41")  # still valid JSON, newline intact, no zero fill
    write_journal(journaled, [*lines[:-1], edited])
    assert_refused_untouched(
        journaled.parent, lambda: JsonFileStore(journaled), "journal", f"line {len(lines)}", "checksum"
    )


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda line: line[: len(line) // 2] + b"\n", id="cut-in-half-then-newline"),
        pytest.param(lambda line: line[:20] + b"\0" * (len(line) - 21) + b"\n", id="zero-filled"),
        pytest.param(lambda line: line.replace(b'"entry":{', b'"entry":['), id="brace-flipped"),
        pytest.param(lambda line: line[:-3] + bytes([line[-3] ^ 0x20]) + line[-2:], id="last-brace-flipped"),
    ],
)
def test_json_whole_last_line_that_fails_is_refused_not_cut_off(journaled: Path, damage) -> None:  # type: ignore[no-untyped-def]
    """A last line WITH its newline was written whole; cutting it off would silently drop t14,
    whose insert had been acknowledged. Only bytes after the last newline are a torn append."""
    lines = journal_lines(journaled)
    write_journal(journaled, [*lines[:-1], damage(lines[-1])])
    assert_refused_untouched(
        journaled.parent, lambda: JsonFileStore(journaled), "journal", "line 5", "not a torn append"
    )


@pytest.mark.parametrize("seed", range(6))
def test_json_whole_last_line_with_one_flipped_byte_is_refused(journaled: Path, seed: int) -> None:
    rng = random.Random(seed)
    lines = journal_lines(journaled)
    last = bytearray(lines[-1])
    position = rng.randrange(len(last) - 1)  # any byte but the newline
    # any change of that byte except one that makes it a newline (the line would no longer be one line)
    last[position] ^= rng.choice([x for x in range(1, 256) if last[position] ^ x != ord("\n")])
    assert last.count(b"\n") == 1
    write_journal(journaled, [*lines[:-1], bytes(last)])
    assert_refused_untouched(journaled.parent, lambda: JsonFileStore(journaled), "journal", "line 5")


# ============================================================================ damage that opened
# silently or leaked raw sqlite3 errors; each case now refused at open with the file untouched, and the
# same damage met at run time (``validate=False``) is a project error, never a raw sqlite3 one.
def write_invalid_utf8(path: Path, column: str, task_id: str = "t5") -> None:
    """Store bytes that are not UTF-8 as TEXT (SQLite keeps what it is given)."""
    bad = b'{"n":"\xff\xfe"}' if column in ("payload", "result") else b"ll\xffm"
    hand_edit(path, f"UPDATE tasks SET {column} = CAST(X'{bad.hex()}' AS TEXT) WHERE id = '{task_id}'")


@pytest.mark.parametrize("column", ["kind", "payload", "error"])
def test_sqlite_invalid_utf8_is_refused_at_open(sqlite_path: Path, column: str) -> None:
    write_invalid_utf8(sqlite_path, column)
    assert_refused_untouched(
        sqlite_path.parent, lambda: SqliteStore(sqlite_path), str(sqlite_path), "task 't5'", "not valid UTF-8"
    )


def test_sqlite_invalid_utf8_met_at_run_time_is_store_corrupt_error(sqlite_path: Path) -> None:
    write_invalid_utf8(sqlite_path, "payload")
    with SqliteStore(sqlite_path, validate=False) as store:
        assert store.get("t4") is not None  # the other rows still read
        with pytest.raises(StoreCorruptError, match="cannot read task 't5'"):
            store.get("t5")
        with pytest.raises(StoreCorruptError, match=str(sqlite_path)):
            store.list_by_status()


def stale_status_index(path: Path, task_id: str) -> None:
    """Make ``tasks_by_status`` disagree with its table: ``task_id`` turns running while the
    index (detached from the schema meanwhile) still files it under queued."""
    conn = sqlite3.connect(path, isolation_level=None)
    sql, root = conn.execute(
        "SELECT sql, rootpage FROM sqlite_master WHERE name = 'tasks_by_status'"
    ).fetchone()
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("DELETE FROM sqlite_master WHERE name = 'tasks_by_status'")
    conn.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"UPDATE tasks SET status = 'running', started_at = 1.5 WHERE id = '{task_id}'")
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute(
        "INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) VALUES ('index', ?, 'tasks', ?, ?)",
        ("tasks_by_status", root, sql),
    )
    conn.close()


def test_sqlite_corrupted_status_index_is_refused_at_open(sqlite_path: Path) -> None:
    """quick_check passed this file and recover() then never saw the running task (list_by_status
    used the index); the open-time integrity_check compares every index with its table."""
    stale_status_index(sqlite_path, "t7")
    conn = sqlite3.connect(sqlite_path)
    assert conn.execute("SELECT id FROM tasks WHERE status = 'running'").fetchall() == []  # the damage
    conn.close()
    assert_refused_untouched(
        sqlite_path.parent,
        lambda: SqliteStore(sqlite_path),
        str(sqlite_path),
        "integrity check failed",
        "tasks_by_status",
    )


def test_sqlite_write_on_a_damaged_file_is_store_write_error(sqlite_path: Path) -> None:
    stale_status_index(sqlite_path, "t7")
    with SqliteStore(sqlite_path, validate=False) as store:
        running = store.get("t7")
        assert running is not None and running.status is TaskStatus.RUNNING
        with pytest.raises(StoreWriteError, match=r"update of task 't7' to succeeded.*malformed") as raised:
            store.update(transition(running, TaskStatus.SUCCEEDED, 2.0, result={}))
        assert isinstance(raised.value.__cause__, sqlite3.DatabaseError)
        store.insert_and_claim(task(900))  # a write that does not touch the damaged entry still works
        assert store.get("t900") is not None


@pytest.mark.parametrize("cut", [1, 100, 4096], ids=["one-byte", "hundred-bytes", "one-page"])
def test_sqlite_file_cut_short_is_refused(sqlite_path: Path, cut: int) -> None:
    """SQLite zero-fills a short last page, so a file one byte short opened with a changed value."""
    sqlite_path.write_bytes(sqlite_path.read_bytes()[:-cut])
    assert_refused_untouched(
        sqlite_path.parent, lambda: SqliteStore(sqlite_path), str(sqlite_path), "truncated"
    )


# ---------------------------------------------------------------------------- JSON snapshot checksum
def test_json_snapshot_with_a_flipped_payload_byte_is_refused(json_path: Path) -> None:
    """Before the checksum, this opened with task t3's payload silently altered ("x" -> "y")."""
    raw = json_path.read_bytes()
    position = raw.index(b'"pad":"xxxx') + 8
    json_path.write_bytes(raw[:position] + b"y" + raw[position + 1 :])
    assert_refused_untouched(
        json_path.parent, lambda: JsonFileStore(json_path), str(json_path), "checksum mismatch"
    )


@pytest.mark.parametrize("seed", range(12))
def test_json_snapshot_with_any_flipped_byte_is_refused(json_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    raw = bytearray(json_path.read_bytes())
    raw[rng.randrange(len(raw) - 1)] ^= rng.randrange(1, 256)  # any byte but the final newline
    json_path.write_bytes(bytes(raw))
    assert_refused_untouched(json_path.parent, lambda: JsonFileStore(json_path), str(json_path))


def test_json_reformatted_snapshot_is_refused(json_path: Path) -> None:
    json_path.write_text(json.dumps(json.loads(json_path.read_text()), indent=2))  # same content, re-laid out
    assert_refused_untouched(json_path.parent, lambda: JsonFileStore(json_path), "checksummed layout")


def test_json_version_1_snapshot_still_opens_and_is_rewritten_as_version_2(json_path: Path) -> None:
    view = read_document(json_path)
    json_path.write_text(json.dumps({**view, "version": 1}))  # what an older aiqsim wrote
    with JsonFileStore(json_path) as store:
        assert len(store) == 30 and store.get("t4").result == {"n": 4}
        store.compact()
    doc = json.loads(json_path.read_text())
    assert doc["version"] == 2 and len(doc["store"]["tasks"]) == 30


# ---------------------------------------------------------------------------- JSON shapes json.loads accepts
def sealed_snapshot(store: object) -> bytes:
    """A version-2 snapshot whose checksum matches ``store``, whatever ``store`` is."""
    body = json.dumps(store, separators=(",", ":")).encode()
    return b'{"format":"aiqsim-taskstore","version":2,"crc":"%08x","store":%b}\n' % (zlib.crc32(body), body)


@pytest.mark.parametrize("store", [[], None, "tasks", 7], ids=["list", "null", "string", "number"])
def test_json_sealed_snapshot_whose_store_is_not_an_object_is_refused(json_path: Path, store: object) -> None:
    """The checksum matched, so this reached ``store.get`` and raised AttributeError."""
    json_path.write_bytes(sealed_snapshot(store))
    assert_refused_untouched(
        json_path.parent, lambda: JsonFileStore(json_path), str(json_path), "'store' must be an object"
    )


DEEP = b"[" * 50_000 + b"]" * 50_000


def test_json_deeply_nested_snapshot_is_refused(json_path: Path) -> None:
    """json.loads raised RecursionError."""
    json_path.write_bytes(DEEP)
    assert_refused_untouched(
        json_path.parent, lambda: JsonFileStore(json_path), str(json_path), "nested too deeply"
    )


def test_json_deeply_nested_journal_entry_with_a_valid_checksum_is_refused(journaled: Path) -> None:
    """The line's checksum matched, then json.loads raised RecursionError."""
    last_seq = read_document(journaled)["last_seq"]
    body = b'{"seq":%d,"op":"poison","key":%b,"error":"e","recorded_at":1}' % (last_seq + 6, DEEP)
    line = b'{"crc":"%08x","entry":%b}\n' % (zlib.crc32(body), body)
    write_journal(journaled, [*journal_lines(journaled), line])
    assert_refused_untouched(
        journaled.parent, lambda: JsonFileStore(journaled), str(journaled) + ".journal", "line 6"
    )


@pytest.mark.parametrize("column", ["payload", "result"])
def test_sqlite_json_column_nested_too_deeply_is_store_corrupt_error(sqlite_path: Path, column: str) -> None:
    """Nested 1,500 deep passes SQLite's json_valid; json.loads then raised RecursionError."""
    deep = "[" * 1500 + "]" * 1500
    hand_edit(sqlite_path, f"UPDATE tasks SET {column} = '{deep}' WHERE id = 't5'")
    with SqliteStore(sqlite_path) as store:
        assert store.get("t4") is not None  # the other rows still read
        with pytest.raises(StoreCorruptError, match=rf"task 't5': column '{column}' .*nested too deeply"):
            store.get("t5")
        with pytest.raises(StoreCorruptError, match=str(sqlite_path)):
            store.list_by_status()


# ---------------------------------------------------------------------------- SQLite write-ahead log
WAL_TASKS = 20


@pytest.fixture(scope="module")
def killed_wal_template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files a process leaves that committed WAL_TASKS tasks one by one and was SIGKILLed before
    any checkpoint: every task lives only in the -wal (built once, copied per test)."""
    path = tmp_path_factory.mktemp("killed") / "tasks.sqlite"
    script = (
        "import os, signal, sys\n"
        "from aiqsim.core.task import TaskRecord\n"
        "from aiqsim.stores import SqliteStore\n"
        "store = SqliteStore(sys.argv[1])\n"
        f"for n in range({WAL_TASKS}):\n"
        "    store.insert_and_claim(TaskRecord(id=f't{n}', key=f'k{n}', kind='llm', provider='llm'))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    died = subprocess.run([sys.executable, "-c", script, str(path)])
    assert died.returncode == -9
    files = snapshot_of(path.parent)
    assert set(files) == {"tasks.sqlite", "tasks.sqlite-wal", "tasks.sqlite-shm"}
    return files


WAL_FRAME = 24 + 4096  # the store's page size is SQLite's default


@pytest.fixture
def killed_wal(tmp_path: Path, killed_wal_template: dict[str, bytes]) -> Path:
    for name, data in killed_wal_template.items():
        (tmp_path / name).write_bytes(data)
    path = tmp_path / "tasks.sqlite"
    frames, partial = divmod(len(wal_of(path)) - 32, WAL_FRAME)
    assert frames >= 2 * WAL_TASKS and partial == 0
    return path


def wal_of(path: Path) -> bytes:
    return path.with_name(path.name + "-wal").read_bytes()


def edit_wal(path: Path, offset: int, change: Callable[[int], int] = lambda byte: byte ^ 0xFF) -> None:
    wal = bytearray(wal_of(path))
    wal[offset] = change(wal[offset])
    path.with_name(path.name + "-wal").write_bytes(bytes(wal))


def middle_frame(path: Path) -> int:
    """The offset of a frame half way through the -wal (committed transactions follow it)."""
    return 32 + (len(wal_of(path)) - 32) // WAL_FRAME // 2 * WAL_FRAME


def test_sqlite_intact_wal_of_a_killed_process_opens_whole(killed_wal: Path) -> None:
    with SqliteStore(killed_wal) as store:
        assert [r.id for r in store.list_by_status()] == [f"t{n}" for n in range(WAL_TASKS)]


@pytest.mark.parametrize(
    "where",
    [24 + 2000, 0, 3, 8, 15, 17],
    ids=["page-byte", "page-number", "page-number-low", "salt-1", "salt-2", "checksum"],
)
def test_sqlite_damaged_wal_frame_before_committed_transactions_is_refused(
    killed_wal: Path, where: int
) -> None:
    """Before: the store opened with the tasks up to the damaged frame (half of them), and
    checkpointed the -wal, so the committed tasks after it were gone with the evidence."""
    edit_wal(killed_wal, middle_frame(killed_wal) + where)
    assert_refused_untouched(
        killed_wal.parent, lambda: SqliteStore(killed_wal), str(killed_wal) + "-wal", "committed transaction"
    )


def test_sqlite_damaged_wal_header_is_refused(killed_wal: Path) -> None:
    edit_wal(killed_wal, 12)  # the checkpoint sequence number: the header's checksum no longer matches
    assert_refused_untouched(
        killed_wal.parent,
        lambda: SqliteStore(killed_wal),
        str(killed_wal) + "-wal",
        "header fails its checksum",
    )


@pytest.mark.parametrize("magic", [b"\0\0\0\0", b"\x37\x7f\x06\x84"], ids=["zeroed", "wrong"])
def test_sqlite_wal_with_a_wrong_magic_is_refused(killed_wal: Path, magic: bytes) -> None:
    wal = killed_wal.with_name(killed_wal.name + "-wal")
    wal.write_bytes(magic + wal.read_bytes()[4:])
    assert_refused_untouched(killed_wal.parent, lambda: SqliteStore(killed_wal), "not an SQLite WAL file")


@pytest.mark.parametrize("cut", [1, 100, WAL_FRAME - 1], ids=["one-byte", "hundred-bytes", "frame-less-one"])
def test_sqlite_wal_cut_inside_its_last_frame_is_a_torn_tail_and_opens(killed_wal: Path, cut: int) -> None:
    wal = killed_wal.with_name(killed_wal.name + "-wal")
    wal.write_bytes(wal.read_bytes()[:-cut])
    with SqliteStore(killed_wal) as store:  # the last transaction was not whole: it never happened
        assert [r.id for r in store.list_by_status()] == [f"t{n}" for n in range(WAL_TASKS - 1)]


def test_sqlite_wal_damaged_only_in_its_last_transaction_is_a_torn_tail_and_opens(killed_wal: Path) -> None:
    edit_wal(killed_wal, len(wal_of(killed_wal)) - 100)  # the last (commit) frame's page
    with SqliteStore(killed_wal) as store:
        assert [r.id for r in store.list_by_status()] == [f"t{n}" for n in range(WAL_TASKS - 1)]


def test_sqlite_wal_with_garbage_frames_after_its_last_commit_opens(killed_wal: Path) -> None:
    wal = killed_wal.with_name(killed_wal.name + "-wal")
    wal.write_bytes(wal.read_bytes() + random.Random(3).randbytes(2 * WAL_FRAME + 7))
    with SqliteStore(killed_wal) as store:
        assert len(store) == WAL_TASKS
