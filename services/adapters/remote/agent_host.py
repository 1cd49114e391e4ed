"""What an SSH machine offers trials, for the remote agent (stdlib only, Python >= 3.9).

Shipped beside ``agent.py``, which answers the adapter's ``probe`` and ``gpus`` requests with these
(in a thread each: both run a program that may take seconds). They read the machine as a trial
will find it and change nothing:

- :func:`probe`: the ``python3`` a trial gets with ``pythonPath`` first on ``PATH``, its version,
  and whether it can import ``nni``, so the adapter refuses a machine that cannot run trials
  before it launches one there;
- :func:`gpus`: ``nvidia-smi -q -x`` as text, and the session of each process it lists, so the
  adapter's GPU placement tells our trials' processes (each keeper leads a session) from foreign
  ones.
"""

import os
import re
import shutil
import subprocess


def probe(python_path=None):
    """``{"python": version, "nni": bool, "path": PATH, "where": path of python3}`` for the ``python3``
    on ``PATH`` with ``python_path`` first (``python`` None when there is none that runs)."""
    env = dict(os.environ)
    if python_path:
        env["PATH"] = python_path + ":" + env.get("PATH", "")
    code = "import importlib.util, sys; print(sys.version.split()[0], importlib.util.find_spec('nni') is not None)"
    try:
        done = subprocess.run(["python3", "-c", code], env=env, capture_output=True, timeout=60)
    except FileNotFoundError:
        return {"python": None, "nni": False, "path": env["PATH"]}
    words = done.stdout.decode().split()
    if done.returncode != 0 or len(words) != 2:
        return {"python": None, "nni": False, "path": env["PATH"]}
    where = shutil.which("python3", path=env["PATH"])
    return {"python": words[0], "nni": words[1] == "True", "path": env["PATH"], "where": where}


def gpus(nvidia_smi=None):
    """``{"xml": …, "sessions": {pid: sid or None}}`` from ``nvidia-smi -q -x`` (``nvidia_smi``: its
    path), or ``{"error": …}`` saying why it could not run; a session is None when the process is
    not visible here."""
    try:
        done = subprocess.run([nvidia_smi or "nvidia-smi", "-q", "-x"], capture_output=True, timeout=30)
    except FileNotFoundError:
        return {"error": "nvidia-smi not found"}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"nvidia-smi failed: {exc}"}
    if done.returncode != 0:
        last = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()[-1:]
        why = (": " + last[0]) if last else ""
        return {"error": f"nvidia-smi exited with {done.returncode}{why}"}
    xml = done.stdout.decode("utf-8", "replace")
    sessions: dict[str, int | None] = {}  # None: not ours to see, or gone
    for pid in set(re.findall(r"<pid>\s*(\d+)\s*</pid>", xml)):
        try:
            sessions[pid] = os.getsid(int(pid))
        except (ProcessLookupError, PermissionError):
            sessions[pid] = None
    return {"xml": xml, "sessions": sessions}
