"""Fixtures: a real sluice_queue_server process per test, on a free loopback
port, stopped (SIGTERM, then SIGKILL) at the end of the test.

The server binary comes from $SLUICE_QUEUE_SERVER (CTest sets it), else from
build/release/apps/ of this checkout. `import sluice` needs PYTHONPATH to
hold build/<preset>/python (CTest sets it too).
"""

import os
import pathlib
import select
import signal
import subprocess
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def pytest_runtest_logreport(report):
    """Each skipped test, by name, appended to $SLUICE_SKIP_LOG where it is set
    (the test command lists what did not run: setup.sh)."""
    log = os.environ.get("SLUICE_SKIP_LOG")
    if not report.skipped or not log:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = " ".join(str(reason).split())
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"pytest: {report.nodeid} skipped: {reason}\n")


def server_binary() -> str:
    path = os.environ.get("SLUICE_QUEUE_SERVER") or str(REPO / "build" / "release" / "apps" / "sluice_queue_server")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no sluice_queue_server at {path} (build it, or set SLUICE_QUEUE_SERVER)")
    return path


class Server:
    """A sluice_queue_server child process."""

    def __init__(self, *flags: str):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [server_binary(), "--bind=tcp://127.0.0.1:0", *flags],
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        # The first line of stdout is the bound endpoint.
        ready, _, _ = select.select([self.proc.stdout], [], [], 20.0)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("tcp://"):
            self.stop()
            pytest.fail(f"sluice_queue_server did not start: {line!r} {self.stderr()}")
        self.endpoint = line

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc.stdout.close()
        return self.proc.returncode


@pytest.fixture
def start_server():
    """start_server(*flags) -> Server; every server is stopped afterwards and
    must have exited cleanly (status 0 after SIGTERM)."""
    servers = []

    def start(*flags: str) -> Server:
        s = Server(*flags)
        servers.append(s)
        return s

    yield start
    for s in servers:
        rc = s.stop()
        assert rc == 0, f"sluice_queue_server exited with {rc}: {s.stderr()}"


SHM_FLAGS = ("--shm-bytes=64M",)


@pytest.fixture(params=["tcp", "shm"])
def hub(request, start_server):
    """(server, client): over TCP (a server without an arena) or over the
    shared-memory arena (the default shm='auto' must pick it up)."""
    from sluice import transfer_queue as tq

    server = start_server(*(SHM_FLAGS if request.param == "shm" else ()))
    client = tq.connect(server.endpoint)
    assert client.transport == request.param
    yield server, client
    client.close()


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
