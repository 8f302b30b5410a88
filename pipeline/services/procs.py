"""Small process helpers shared by the local services: free ports, logged commands with progress, stopping."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from pipeline.errors import ServiceError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``GET url`` answers 200 (a readiness or health endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def go_output(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """``go ARGS``'s standard output; a failure is a :class:`ServiceError` with the end of its error output."""
    try:
        out = subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    except subprocess.CalledProcessError as exc:
        raise ServiceError(f"go {' '.join(args)} failed: {exc.stderr.strip()[-400:]}") from exc
    return out.stdout


def run_logged(
    cmd: Sequence[str],
    log_path: Path,
    what: str,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    total: int | None = None,
    progress: Callable[[str], int] | None = None,
    poll: Callable[[], int] | None = None,
) -> None:
    """Run ``cmd`` to completion with its output in ``log_path`` and a progress bar on stderr.

    ``progress(line)`` returns how many units a line of output completed; ``poll()`` returns the number of
    units done so far (for builds whose progress is only visible on disk). On failure the error names the log.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=total, desc=what, unit="", dynamic_ncols=True, leave=True, mininterval=1.0)
    with (
        log_path.open("ab") as log,
        subprocess.Popen(
            list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0
        ) as proc,
    ):
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        pending = b""
        while True:
            chunk = proc.stdout.read(65536)
            if chunk:
                log.write(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if progress:
                    for line in lines:
                        bar.update(progress(line.decode(errors="replace")))
            elif proc.poll() is not None:
                break
            else:
                if poll:
                    done = poll()
                    if done > bar.n:
                        bar.update(done - bar.n)
                time.sleep(0.5)
        if proc.returncode == 0 and total:
            bar.update(total - bar.n)
        bar.close()
        if proc.returncode != 0:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise ServiceError(f"{what} failed (exit {proc.returncode}); see {log_path}: " + " | ".join(tail)[-600:])


def start_daemon(cmd: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start a long-running server in its own process group, output to ``log_path``; returns its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return proc.pid


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still answers kill(0); reap it if it is ours
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def runs_in(pid: int, folder: Path) -> bool:
    """Whether ``pid`` is alive and is a server started on ``folder`` (its command line names a path in it), not
    another process that took the pid after a reboot; without /proc (not Linux) a live pid is taken as the server."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # it exited a moment ago; or no /proc (not Linux)
    except OSError:
        return True
    return str(folder.resolve()).encode() in cmdline or str(folder).encode() in cmdline


def stop_pid(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group, wait, then SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.1)


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            raise ServiceError(f"{what} exited during start-up")
        time.sleep(0.2)
    raise ServiceError(f"{what} did not become ready within {timeout_s:.0f}s")
