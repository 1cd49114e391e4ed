"""What both emulators do with the processes they run: stop the server, kill every process
group it recorded (also after it crashed), and tell whether a process is still alive."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from trialbus.stack.processes import free_port  # noqa: F401 - the emulators' ports are as distinct as the stack's


def stop_server(process: subprocess.Popen[bytes], state_dir: Path) -> None:
    """SIGTERM (SIGKILL after 10 s) to the server, then SIGKILL to every process group it
    recorded in ``<state_dir>/pgids``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for record in (state_dir / "pgids").glob("*"):
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.killpg(int(record.name), signal.SIGKILL)
        record.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (an orphan may wait for PID 1 to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
