"""A real `orbitkv serve` in its own temporary directory, for the package and adapter tests."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SEND_TIMEOUT_MS = 1000


def orbitkv_bin() -> str:
    """The `orbitkv` binary: ORBITKV_BIN, else the workspace's debug build."""
    path = os.environ.get("ORBITKV_BIN") or str(REPO / "target" / "debug" / "orbitkv")
    if not Path(path).exists():
        pytest.fail(
            f"no orbitkv binary at {path}: build it (cargo build -p orbitkv) or set ORBITKV_BIN"
        )
    return path


class Daemon:
    """A running `orbitkv serve` with its data directory and socket under `root`."""

    def __init__(self, root: Path, **flags: str) -> None:
        """`flags`: options of `orbitkv serve` (`dram_bytes="64KiB"`), over these defaults."""
        self.root = root
        options = {"dram_bytes": "256MiB", "ssd_bytes": "2GiB", "segment_bytes": "32MiB"}
        options.update(flags)
        self.socket = str(root / "orbitkv.sock")
        self.log = root / "serve.log"
        self._log = self.log.open("w")
        # A peer that leaves its replies unread for a second is disconnected: the tests show
        # the package never does.
        config = root / "orbitkv.toml"
        config.write_text(f"[limits]\nsend_timeout_ms = {SEND_TIMEOUT_MS}\n")
        self.proc = subprocess.Popen(
            [
                orbitkv_bin(),
                "serve",
                "--config",
                str(config),
                "--data-dir",
                str(root / "data"),
                "--socket",
                self.socket,
                "--metrics",
                "127.0.0.1:0",
                *(x for k, v in options.items() for x in ("--" + k.replace("_", "-"), v)),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while "listening on" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"orbitkv serve did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def pause(self) -> None:
        """Stops the daemon with its socket open (SIGSTOP), returning once it is stopped."""
        self.proc.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{self.proc.pid}/stat")
        deadline = time.monotonic() + 5
        # The state follows the name, which is in parentheses.
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "the daemon stopped"
            time.sleep(0.005)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
