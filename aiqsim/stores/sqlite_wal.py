"""Read an SQLite ``-wal`` file the way SQLite's recovery does, to find damage it would drop silently.

When a database is opened with a ``-wal`` that no live connection has indexed yet (after a crash),
SQLite replays it frame by frame and stops at the first frame that fails its checksum or salts,
without a word: every transaction committed after that frame is dropped, and the next
checkpoint then rewrites the ``-wal``, destroying the evidence. A torn tail (a crash in the middle
of an append) looks the same to it, and there dropping the tail is right.

:func:`wal_problem` tells the two apart from the documented format
(https://www.sqlite.org/fileformat2.html#walformat): a 32-byte header (magic 0x377f0682 or
0x377f0683, format version, page size, checkpoint sequence, two salts, a checksum of the first 24
bytes), then frames of a 24-byte header (page number, database size after commit -- non-zero
only on a transaction's last frame --, the two salts, a checksum) and one page. Checksums are
cumulative: each frame's covers its first 8 header bytes and its page, seeded with the previous
frame's (the header's for the first). Fields are big-endian; the checksum reads the data as
32-bit words in the byte order the magic's low bit names (1: big-endian).

A frame that fails, followed by a commit frame carrying the header's salts, means committed
transactions would be lost: that is damage. Bad frames only after the last valid commit frame,
or a partial last frame, are a torn tail. Frames with other salts are left over from before the
last WAL restart and are ignored, as SQLite ignores them.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

__all__ = ["WAL_HEADER_SIZE", "wal_problem"]

WAL_HEADER_SIZE = 32
FRAME_HEADER_SIZE = 24
WAL_FORMAT_VERSION = 3007000
_MAGIC_LITTLE = 0x377F0682
_MAGIC_BIG = 0x377F0683
_MASK = 0xFFFFFFFF


def _checksum(data: bytes | memoryview, big_endian: bool, s0: int, s1: int) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), seeded with ``(s0, s1)``."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    pairs = iter(words)
    for first, second in zip(pairs, pairs, strict=True):
        s0 = (s0 + first + s1) & _MASK
        s1 = (s1 + second + s0) & _MASK
    return s0, s1


@functools.cache
def _frame_weights(pairs: int) -> tuple[Any, tuple[int, int, int, int]]:
    """The checksum of ``pairs`` word pairs as one linear map (so numpy can run every frame at once).

    A step is ``s0 += a + s1; s1 += b + s0``, i.e. ``s' = M s + (a, a + b)`` with M = [[1, 1], [1, 2]].
    After n pairs, ``s = M**n seed + sum_k M**(n-1-k) (a_k, a_k + b_k)`` mod 2**32: returns the
    weights of each word in that sum (rows: s0, s1) and ``M**n`` mod 2**32. uint64 arithmetic wraps
    mod 2**64, a multiple of 2**32, so the result taken mod 2**32 is exact.
    """
    import numpy as np

    powers = [(1, 0, 0, 1)]  # M**j mod 2**32, flattened
    for _ in range(pairs):
        p00, p01, p10, p11 = powers[-1]
        powers.append(
            ((p00 + p01) & _MASK, (p00 + 2 * p01) & _MASK, (p10 + p11) & _MASK, (p10 + 2 * p11) & _MASK)
        )
    weights = np.zeros((2, 2 * pairs), dtype=np.uint64)
    for k in range(pairs):
        p00, p01, p10, p11 = powers[pairs - 1 - k]
        weights[0, 2 * k] = (p00 + p01) & _MASK  # a_k counts in both (a, a + b) components
        weights[0, 2 * k + 1] = p01
        weights[1, 2 * k] = (p10 + p11) & _MASK
        weights[1, 2 * k + 1] = p11
    return weights, powers[pairs]


def _frame_sums(data: bytes, big_endian: bool, frames: int, page_size: int) -> list[tuple[int, int]]:
    """Each frame's checksum over its first 8 header bytes and its page, seeded with (0, 0)."""
    import numpy as np

    width = (FRAME_HEADER_SIZE + page_size) // 4
    words = np.frombuffer(
        data, dtype=">u4" if big_endian else "<u4", count=frames * width, offset=WAL_HEADER_SIZE
    ).reshape(frames, width)
    covered = np.concatenate((words[:, :2], words[:, FRAME_HEADER_SIZE // 4 :]), axis=1).astype(np.uint64)
    weights, _ = _frame_weights(covered.shape[1] // 2)
    sums = (covered @ weights.T) & np.uint64(_MASK)
    return [(int(s0), int(s1)) for s0, s1 in sums]


def _chain(
    seed: tuple[int, int], local: tuple[int, int], power: tuple[int, int, int, int]
) -> tuple[int, int]:
    """A frame's cumulative checksum: ``M**n seed`` plus its own (seed-0) sum, mod 2**32."""
    p00, p01, p10, p11 = power
    return (
        (p00 * seed[0] + p01 * seed[1] + local[0]) & _MASK,
        (p10 * seed[0] + p11 * seed[1] + local[1]) & _MASK,
    )


def _magic_prefixes() -> tuple[bytes, bytes]:
    return _MAGIC_LITTLE.to_bytes(4, "big"), _MAGIC_BIG.to_bytes(4, "big")


def wal_problem(data: bytes) -> str | None:
    """What in the ``-wal`` bytes ``data`` would make SQLite drop committed transactions, or None.

    None for an empty file, a header cut short, an intact log and a torn tail.
    """
    if not data:
        return None
    head = data[:4]
    if not any(magic.startswith(head) for magic in _magic_prefixes()):
        return f"not an SQLite WAL file (header magic 0x{head.hex()}, expected 0x377f0682 or 0x377f0683)"
    if len(data) < WAL_HEADER_SIZE:
        return None  # a header cut short: no frame can have been written after it
    magic, version, page_size, _, _, _, sum0, sum1 = struct.unpack(">8I", data[:WAL_HEADER_SIZE])
    big_endian = magic == _MAGIC_BIG
    if _checksum(data[:24], big_endian, 0, 0) != (sum0, sum1):
        if len(data) == WAL_HEADER_SIZE:
            return None
        return (
            "the WAL header fails its checksum, so SQLite would ignore every frame after it "
            f"({len(data) - WAL_HEADER_SIZE} bytes, possibly committed transactions)"
        )
    if version != WAL_FORMAT_VERSION:
        return f"unsupported WAL format version {version} (expected {WAL_FORMAT_VERSION})"
    if not 512 <= page_size <= 65536 or page_size & (page_size - 1):
        return f"invalid page size {page_size} in the WAL header"
    salts = data[16:24]
    frame_size = FRAME_HEADER_SIZE + page_size
    frames = (len(data) - WAL_HEADER_SIZE) // frame_size  # a partial last frame is a torn append
    view = memoryview(data)
    sums = _frame_sums(data, big_endian, frames, page_size) if frames else []
    _, power = _frame_weights((8 + page_size) // 8)
    checksum = (sum0, sum1)
    first_bad = None
    for index in range(frames):
        start = WAL_HEADER_SIZE + index * frame_size
        header = view[start : start + FRAME_HEADER_SIZE]
        page_number, _, _, _, stored0, stored1 = struct.unpack(">6I", header)
        checksum = _chain(checksum, sums[index], power)
        if header[8:16] != salts or page_number == 0 or checksum != (stored0, stored1):
            first_bad = index
            break
    if first_bad is None:
        return None
    commits_after = []
    for index in range(first_bad + 1, frames):
        start = WAL_HEADER_SIZE + index * frame_size
        header = view[start : start + FRAME_HEADER_SIZE]
        if header[8:16] == salts and int.from_bytes(header[4:8], "big") != 0:
            commits_after.append(index + 1)
    if not commits_after:
        return None  # bad frames only after the last commit: a torn tail, which SQLite rightly drops
    return (
        f"frame {first_bad + 1} of {frames} fails its checksum or salts, yet {len(commits_after)} "
        f"committed transaction(s) follow it (commit frames {commits_after[0]}"
        f"{f'..{commits_after[-1]}' if len(commits_after) > 1 else ''}); SQLite would silently drop "
        "them from that frame on"
    )
