"""Throwaway PostgreSQL and Redis servers on loopback, for the tests that need real ones.

A test session uses, in order: the server named by ``AIQSIM_TEST_POSTGRES_DSN`` /
``AIQSIM_TEST_REDIS_URL`` (``.ci/run`` starts both and exports them); else one it starts itself
from the binaries on this machine (PostgreSQL's ``initdb``/``pg_ctl``, ``redis-server``) in a
temporary directory on a free port, stopped at the end of the session; else nothing — and then
the tests that need it are skipped, except under ``CI=true``, where a missing server fails
the run instead (a CI that silently skipped them would prove nothing).

PostgreSQL refuses to run as root: as root the cluster is initialised and run as the
``postgres`` system user (``runuser``), in a directory that user owns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

PG_BIN_DIRS = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")


class ServerUnavailable(RuntimeError):
    """The server could not be found or started here; the message says why."""


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServerUnavailable(f"the server exited with status {process.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise ServerUnavailable(f"nothing listened on 127.0.0.1:{port} within {timeout_s:g} s")


def _pg_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for directory in PG_BIN_DIRS:
        candidate = Path(directory) / name
        if candidate.exists():
            return str(candidate)
    return None


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yield the DSN of a fresh PostgreSQL cluster on a free loopback port (trust auth, db ``aiqsim``)."""
    initdb, pg_ctl = _pg_tool("initdb"), _pg_tool("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise ServerUnavailable("PostgreSQL's initdb/pg_ctl are not installed")
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    if as_root:
        runuser = shutil.which("runuser")
        if runuser is None:
            raise ServerUnavailable("running as root, and no runuser to start PostgreSQL as 'postgres'")
        prefix = [runuser, "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="aiqsim-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if as_root:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    port = free_port()
    log = root / "server.log"
    try:
        subprocess.run(
            [*prefix, initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        # fsync=off, as .ci/services.sh: the suite kills clients and servers, never the machine, and the
        # page cache survives a killed process, so a flush to disk per commit proves nothing here (the
        # test Redis has no persistence at all). It cost the PostgreSQL crash suite most of its time.
        options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        subprocess.run(
            [*prefix, pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"],
            check=True,
            capture_output=True,
            timeout=90,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        detail = getattr(error, "stderr", b"") or b""
        text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        message = f"PostgreSQL did not start: {error}: {detail.decode(errors='replace')} {text}"
        raise ServerUnavailable(message) from None
    try:
        _wait_for_port(port, 30)
        createdb = _pg_tool("createdb") or "createdb"
        subprocess.run(
            [*prefix, createdb, "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "aiqsim"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield f"postgresql://postgres@127.0.0.1:{port}/aiqsim"
    finally:
        stop = [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]
        subprocess.run(stop, capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def redis_server(*, cluster: bool = False) -> Iterator[str]:
    """Yield the URL of a fresh Redis server on a free loopback port (no persistence).

    ``cluster=True``: a Redis Cluster of that one node, owning all 16384 hash slots (answered
    ``cluster_state:ok``), which refuses a command whose keys lie in different slots (``CROSSSLOT``)
    as a cluster of many nodes does, and answers ``CLUSTER KEYSLOT``."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServerUnavailable("redis-server is not installed (Debian: apt-get install redis-server)")
    root = Path(tempfile.mkdtemp(prefix="aiqsim-redis-"))
    port = _cluster_port() if cluster else free_port()
    options = ["--cluster-enabled", "yes", "--cluster-config-file", str(root / "nodes.conf")]
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(root), "--protected-mode", "yes", *(options if cluster else [])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port, 30, process)
        if cluster:
            _own_every_slot(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)


def _cluster_port() -> int:
    """A free port whose cluster bus port (the port + 10000, which a cluster node also listens on)
    exists and is free too: a free port above 55535 made the node exit at start."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with contextlib.suppress(OSError), socket.socket() as sock:
            sock.bind(("127.0.0.1", port + 10000))
            return port
    raise ServerUnavailable("no free port with a free cluster bus port (+10000) in 100 tries")


def _own_every_slot(port: int, timeout_s: float = 30.0) -> None:
    """Give the one node of a fresh cluster every hash slot and wait until it says the cluster is ok."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + timeout_s
        while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):  # raw: no parser
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"the one-node cluster on port {port} was not ok in {timeout_s:g} s")
            time.sleep(0.05)
    finally:
        client.close()
