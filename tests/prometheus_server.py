"""A real Prometheus server on loopback for the tests, and targets a test can add to it.

``.ci/services.sh`` starts one (the distribution's ``prometheus`` package) and exports
``AIQSIM_TEST_PROMETHEUS_URL`` and ``AIQSIM_TEST_PROMETHEUS_TARGETS``, a folder Prometheus reads
scrape targets from (``file_sd``, re-read within a second). Without them, :func:`prometheus_server`
starts a throwaway one the same way. Every test writes a target file of its own with a label of its
own (``aiqsim_test_run``) and queries by that label, so tests running in parallel (pytest-xdist)
share the server without ever reading each other's series.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.servers import ServerUnavailable, free_port

SCRAPE_INTERVAL_S = 1.0

_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""An opener that never goes through a proxy from the environment: every server here is local."""

CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: aiqsim-tests
    file_sd_configs:
      - files: ["{targets}/*.json"]
        refresh_interval: 1s
"""
"""The configuration .ci/services.sh writes too: one job whose targets are the files in a folder."""


def _ready(url: str) -> bool:
    try:
        with _LOOPBACK.open(url + "/-/ready", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def prometheus_server() -> Iterator[tuple[str, Path]]:
    """(URL, targets folder) of a fresh Prometheus on a free loopback port (storage in a temp dir)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise ServerUnavailable("prometheus is not installed (Debian: apt-get install prometheus)")
    root = Path(tempfile.mkdtemp(prefix="aiqsim-prometheus-"))
    targets = root / "targets"
    targets.mkdir()
    (root / "prometheus.yml").write_text(CONFIG.format(targets=targets), encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(root / "prometheus.log", "wb")  # noqa: SIM115 - closed in finally
    process = subprocess.Popen(
        [binary, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = (root / "prometheus.log").read_text(errors="replace")[-500:]
                raise ServerUnavailable(f"prometheus did not start: {tail}")
            time.sleep(0.1)
        yield url, targets
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def scrape_target(targets: Path, port: int) -> Iterator[str]:
    """Make Prometheus scrape ``127.0.0.1:port``; yields the target's ``aiqsim_test_run`` label."""
    run = uuid.uuid4().hex
    path = targets / f"{run}.json"
    staged = targets / f".{run}.tmp"  # written, then renamed: Prometheus never reads half a file
    staged.write_text(
        json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"aiqsim_test_run": run}}]), encoding="utf-8"
    )
    os.replace(staged, path)
    try:
        yield run
    finally:
        path.unlink(missing_ok=True)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """The result vector of an instant query (``/api/v1/query``)."""
    address = url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with _LOOPBACK.open(address, timeout=5) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return body["data"]["result"]
