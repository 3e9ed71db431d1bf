"""The -wal reader (aiqsim.stores.sqlite_wal) against real SQLite logs and hand-built ones.

Real logs check it reads what SQLite writes (page sizes, the byte order of this machine); logs built
here with the spec's plain checksum loop check the other byte order and the fast (numpy) path.
"""

from __future__ import annotations

import shutil
import sqlite3
import struct
from pathlib import Path

import pytest

from aiqsim.stores.sqlite_wal import _checksum, wal_problem


def crash_image(tmp_path: Path, page_size: int, transactions: int = 12) -> bytes:
    """The -wal of a database whose every commit is still only in the log (copied while it is open)."""
    path = tmp_path / "db.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA page_size = {page_size}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE t (n INTEGER, pad TEXT)")
    for n in range(transactions):
        conn.execute("INSERT INTO t VALUES (?, ?)", (n, "x" * 300))
    image = tmp_path / "image"
    image.mkdir()
    shutil.copy(path, image / "db.sqlite")
    shutil.copy(f"{path}-wal", image / "db.sqlite-wal")
    conn.close()
    return (image / "db.sqlite-wal").read_bytes()


@pytest.mark.parametrize("page_size", [512, 4096, 65536])
def test_a_real_log_is_intact_and_a_flipped_byte_before_its_last_commit_is_found(
    tmp_path: Path, page_size: int
) -> None:
    wal = crash_image(tmp_path, page_size)
    frame = 24 + page_size
    frames = (len(wal) - 32) // frame
    assert wal_problem(wal) is None and frames > 12
    damaged = bytearray(wal)
    damaged[32 + frames // 2 * frame + 24 + page_size // 2] ^= 0x01
    assert "committed transaction" in (wal_problem(bytes(damaged)) or "")
    assert wal_problem(wal[:-1]) is None  # a torn last frame


def build_log(big_endian: bool, page_size: int, pages: list[bytes], commits: set[int]) -> bytes:
    """A -wal written by the spec alone (the plain checksum loop), in either byte order."""
    magic = 0x377F0683 if big_endian else 0x377F0682
    head = struct.pack(">6I", magic, 3007000, page_size, 0, 0x1234, 0xABCD)
    checksum = _checksum(head, big_endian, 0, 0)
    out = [head, struct.pack(">2I", *checksum)]
    for index, page in enumerate(pages):
        first = struct.pack(">2I", index + 1, index + 1 if index in commits else 0)
        checksum = _checksum(first + page, big_endian, *checksum)
        out.append(first + head[16:24] + struct.pack(">2I", *checksum) + page)
    return b"".join(out)


@pytest.mark.parametrize("big_endian", [True, False], ids=["big-endian", "little-endian"])
def test_either_byte_order_is_read(big_endian: bool) -> None:
    pages = [bytes((n * 7 + i) % 251 for i in range(1024)) for n in range(6)]
    log = build_log(big_endian, 1024, pages, commits={1, 3, 5})
    assert wal_problem(log) is None
    damaged = bytearray(log)
    damaged[32 + 2 * (24 + 1024) + 500] ^= 0x80  # frame 3: commits at frames 4 and 6 follow
    assert "2 committed transaction(s)" in (wal_problem(bytes(damaged)) or "")
    damaged = bytearray(log)
    damaged[32 + 5 * (24 + 1024) + 500] ^= 0x80  # frame 6, the last commit: a torn tail, no commit after
    assert wal_problem(bytes(damaged)) is None


def test_frames_of_an_earlier_log_generation_are_ignored() -> None:
    """After a WAL restart, frames beyond the new ones carry the old salts: SQLite ignores them."""
    pages = [bytes([n]) * 512 for n in range(4)]
    old = build_log(False, 512, pages, commits={0, 1, 2, 3})
    new = build_log_with_salt(pages[:2], salt1=0x1235)  # salt-1 moves on at a restart
    assert wal_problem(new + old[len(new) :]) is None


def build_log_with_salt(pages: list[bytes], salt1: int) -> bytes:
    """``build_log`` (little-endian, 512-byte pages, one commit at the end) under another salt-1."""
    log = bytearray(build_log(False, 512, pages, commits={len(pages) - 1}))
    struct.pack_into(">I", log, 16, salt1)
    checksum = _checksum(bytes(log[:24]), False, 0, 0)
    struct.pack_into(">2I", log, 24, *checksum)
    for index, page in enumerate(pages):
        start = 32 + index * (24 + 512)
        struct.pack_into(">I", log, start + 8, salt1)
        checksum = _checksum(bytes(log[start : start + 8]) + page, False, *checksum)
        struct.pack_into(">2I", log, start + 16, *checksum)
    return bytes(log)


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (b"", None),
        (b"\x37\x7f", None),  # a header cut short: nothing can follow it
        (b"\x37\x7f\x06\x83" + bytes(28), None),  # a header alone, even a bad one, holds no frame
        (b"SQLite format 3\x00" + bytes(100), "not an SQLite WAL file"),
        (b"\0", "not an SQLite WAL file"),
    ],
    ids=["empty", "short-header", "header-only", "not-a-wal", "zero-byte"],
)
def test_headers(log: bytes, expected: str | None) -> None:
    problem = wal_problem(log)
    assert problem is None if expected is None else expected in (problem or "")


def test_an_unknown_format_version_or_page_size_is_a_problem() -> None:
    for field, value, expected in ((4, 3007001, "format version"), (8, 1000, "page size")):
        head = bytearray(build_log(True, 1024, [bytes(1024)], commits={0}))
        struct.pack_into(">I", head, field, value)
        struct.pack_into(">2I", head, 24, *_checksum(bytes(head[:24]), True, 0, 0))
        assert expected in (wal_problem(bytes(head)) or "")
