"""Many trials running at once on the local adapter: what each costs while it sleeps (issue 23).

A private stack (nats-server, dispatcher, metrics gateway, local-gpu adapter with
``TRIALBUS_MAX_TRIALS`` = ``count``) takes one experiment of ``count`` trials at concurrency
``count``, each reporting two intermediate results and then sleeping. Once all are RUNNING
(and have reported), over a window of ``window`` seconds:

- per keeper and per trial process: RSS, PSS and USS from ``/proc/<pid>/smaps_rollup``
  (PSS is the honest per-trial figure: keepers share pages with their zygote, warm-started
  trials with their template), and the CPU all keepers together spend while their trials sleep;
- the dispatcher's, gateway's, adapter's and nats-server's CPU (% of one core, from
  ``/proc/<pid>/stat`` over the window) and resident memory;
- the time from the first submit to all ``count`` RUNNING, then from stopping the experiment
  to every trial ended, and that no keeper or trial process is left.

The services start with a soft ``RLIMIT_NOFILE`` of 1,024 (a common default; the hard limit
is kept), so descriptors held per trial show up at 1,000 trials as they would on a user's host.

``python -m bench.running --count 1000`` (``--command sleep`` for ``sleep <s>`` as the trial
command, no Python in the trial). CPU figures are noisy on a small shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

from services.adapters import trialdir
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack
from trialbus.client import AsyncClient

#: The trial: two intermediate results through the nni shim (the ``.nni/metrics`` file), then sleep.
SLEEPER = (
    "import sys, time\nimport nni\n\nnni.get_next_parameter()\nnni.report_intermediate_result(0.5)\n"
    "nni.report_intermediate_result(0.7)\ntime.sleep(float(sys.argv[1]))\nnni.report_final_result(1.0)\n"
)
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
#: The soft descriptor limit the services start with (a common default).
SERVICE_NOFILE = 1024


def memory_kib(pid: int) -> dict[str, int] | None:
    """``rss``, ``pss`` and ``uss`` (private clean + dirty) of a process in KiB; None when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            pairs = (line.partition(":") for line in f)
            fields = {k: int(v.split()[0]) for k, _, v in pairs if v.strip()[:1].isdigit()}
    except (OSError, ValueError):
        return None
    return {"rss": fields["Rss"], "pss": fields["Pss"], "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


def cpu_and_wakes(pid: int) -> tuple[float, int] | None:
    """CPU seconds a process has run (``schedstat``: exact, where ``stat``'s ticks miss short
    wake-ups) and its voluntary context switches (its wake-ups); None when it is gone."""
    try:
        ns = 0
        for task in os.listdir(f"/proc/{pid}/task"):  # every thread (nats-server's, the services' to_thread)
            with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
                ns += int(f.read().split()[0])
        with open(f"/proc/{pid}/status") as f:
            wakes = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
    except (OSError, ValueError, StopIteration):
        return None
    return ns / 1e9, wakes


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_KIB / 1024
    except OSError:
        return float("nan")


def open_files(pid: int) -> tuple[int, int]:
    """(descriptors open, soft limit) of a process."""
    try:
        with open(f"/proc/{pid}/limits") as f:
            soft = next(int(line.split()[3]) for line in f if line.startswith("Max open files"))
        return len(os.listdir(f"/proc/{pid}/fd")), soft
    except (OSError, ValueError, StopIteration):
        return -1, -1


def alive(pid: int) -> bool:
    """A live process (not a zombie) with this pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def read_pids(trials_dir: Path) -> list[tuple[int, int]]:
    """(keeper pid, trial pid) of every trial directory whose keeper has started its trial."""
    found = []
    for state in trials_dir.glob(f"*/*/{trialdir.STATE}"):
        with contextlib.suppress(OSError, ValueError):
            values = json.loads(state.read_bytes())
            if "trialPid" in values:
                found.append((int(values["keeperPid"]), int(values["trialPid"])))
    return found


def stop_leftovers(trials_dir: Path) -> None:
    """SIGKILL what a failed run left (trials outlive their adapter by design): each trial's
    process group, and its keeper while its command line still says it is one."""
    for state in trials_dir.glob(f"*/*/{trialdir.STATE}"):
        with contextlib.suppress(OSError, ValueError):
            values = json.loads(state.read_bytes())
            if values.get("done"):
                continue
            if pgid := values.get("pgid"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            keeper = values.get("keeperPid")
            if keeper and b"trial_keeper" in Path(f"/proc/{keeper}/cmdline").read_bytes():
                os.kill(keeper, signal.SIGKILL)


def summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    if not values:
        return {"mean": float("nan"), "p50": float("nan"), "max": float("nan")}
    return {"mean": sum(values) / len(values), "p50": values[len(values) // 2], "max": values[-1]}


async def submit(url: str, experiment: str, count: int, at_once: int = 50) -> None:
    numbers = iter(range(count))

    async def worker(client: AsyncClient) -> None:
        for i in numbers:
            await client.submit_trial(experiment, {"i": i})

    async with AsyncClient(url) as client:
        await asyncio.gather(*(worker(client) for _ in range(at_once)))


def counts(stack: Stack, experiment: str) -> dict[str, int]:
    return stack.rest("GET", f"/experiments/{experiment}").json()["trialCounts"]


def wait_for(check, timeout: float, what: str, say, every: float = 0.5):
    deadline, last_said = time.monotonic() + timeout, time.monotonic()
    while True:
        value, progress = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f}s ({progress})")
        if time.monotonic() - last_said > 10:
            say(f"  … {what}: {progress}")
            last_said = time.monotonic()
        time.sleep(every)


@contextlib.contextmanager
def soft_nofile(limit: int):
    """Processes started inside inherit a soft descriptor limit of ``limit`` (the hard one is kept)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def measure_running(
    count: int = 1000,
    command: str = "python",
    sleep: float = 60,
    window: float = 20,
    say=print,
    root: Path | None = None,
    adapter_env: dict[str, str] | None = None,
) -> dict:
    """Run ``count`` sleeping trials at once and measure them (the module's docstring); the figures.

    ``command``: ``python`` (a Python trial through the nni shim) or ``sleep`` (``sleep <s>``);
    ``adapter_env``: more settings of the adapter (``{"TRIALBUS_WARM_START": "false"}``).
    Every process started here is stopped before it returns.
    """
    root = root or Path(tempfile.mkdtemp(prefix="trialbus-bench-running-"))
    code = root / "code"
    code.mkdir(parents=True)
    (code / "sleeper.py").write_text(SLEEPER)
    trial_command = f"{sys.executable} sleeper.py {sleep:g}" if command == "python" else f"sleep {sleep:g}"
    nats = NatsServer(root / "jetstream").start()
    env = {"TRIALBUS_MAX_TRIALS": str(count), "TRIALBUS_KILL_GRACE": "2", **(adapter_env or {})}
    stack = Stack(root=root, nats=nats, service_env={"adapter": env})
    figures: dict = {"count": count, "command": trial_command, "window_s": window}
    try:
        with soft_nofile(SERVICE_NOFILE):
            stack.start()
        assert nats.proc is not None  # started above
        services = {name: proc.pid for name, proc in stack.procs.items()} | {"nats-server": nats.proc.pid}
        config = {
            "experimentName": "running",
            "trialCommand": trial_command,
            "trialCodeDirectory": str(code),
            "trialConcurrency": count,
            "maxTrialNumber": count,
            "trainingService": {"platform": "local"},
        }
        experiment = stack.rest("POST", "/experiments", json=config).json()["id"]
        say(f"{count:,} trials at once on the local adapter: {trial_command}; work dir {root}")
        begin = time.perf_counter()
        asyncio.run(submit(nats.url, experiment, count))
        figures["submit_s"] = time.perf_counter() - begin

        def all_running():
            now = counts(stack, experiment)
            return now.get("RUNNING", 0) == count, now

        wait_for(all_running, max(120, count * 0.3), "all trials RUNNING", say)
        figures["to_running_s"] = time.perf_counter() - begin
        say(f"  submitted in {figures['submit_s']:.1f} s; all {count:,} RUNNING after {figures['to_running_s']:.1f} s")
        trials_dir = root / "data" / "local-gpu" / "test-host" / "trials"

        def all_started():
            found = read_pids(trials_dir)
            return (found if len(found) == count else None), f"{len(found)} started"

        pids = wait_for(all_started, 60, "every trial's pid in state.json", say)
        time.sleep(3)  # past the keepers' hello (1 s) and the trials' start-up
        figures.update(measure_window(services, pids, window, say))
        figures.update(stop_all(stack, experiment, count, pids, say))
        return figures
    finally:
        stack.stop()
        nats.stop()
        stop_leftovers(root / "data" / "local-gpu" / "test-host" / "trials")


def measure_window(services: dict[str, int], pids: list[tuple[int, int]], window: float, say) -> dict:
    """Memory of every keeper and trial, and CPU of the services and of all keepers over ``window``."""
    figures: dict = {}
    keepers, trials = [k for k, _ in pids], [t for _, t in pids]
    tracked = {**services, **{f"k{pid}": pid for pid in keepers}, **{f"t{pid}": pid for pid in trials}}
    before = {name: cpu_and_wakes(pid) for name, pid in tracked.items()}
    start = time.perf_counter()
    for who, group in (("keeper", keepers), ("trial", trials)):
        found = [m for m in map(memory_kib, group) if m is not None]
        figures[f"{who}_kib"] = {kind: summary([m[kind] for m in found]) for kind in ("rss", "pss", "uss")}
        figures[f"{who}_pss_total_mib"] = sum(m["pss"] for m in found) / 1024
        mem = figures[f"{who}_kib"]
        say(
            f"  per {who} ({len(found):,}): PSS mean {mem['pss']['mean']:,.0f} KiB (max {mem['pss']['max']:,.0f}), "
            f"USS mean {mem['uss']['mean']:,.0f} KiB, RSS mean {mem['rss']['mean']:,.0f} KiB; "
            f"PSS of all: {figures[f'{who}_pss_total_mib']:,.0f} MiB"
        )
    time.sleep(max(0.0, window - (time.perf_counter() - start)))
    elapsed = time.perf_counter() - start
    after = {name: cpu_and_wakes(pid) for name, pid in tracked.items()}

    def percent(names, wakes: bool = False) -> float:
        """% of one core used by ``names`` together over the window (``wakes``: their wake-ups per second)."""
        used = sum(a[wakes] - b[wakes] for n in names if (b := before[n]) and (a := after[n]))
        return used / elapsed if wakes else 100 * used / elapsed

    figures["window_s"] = elapsed
    figures["services"] = {
        name: {"cpu_percent": percent([name]), "rss_mib": rss_mib(pid), "open_files": open_files(pid)}
        for name, pid in services.items()
    }
    figures["keepers_cpu_percent"] = percent([f"k{pid}" for pid in keepers])
    figures["trials_cpu_percent"] = percent([f"t{pid}" for pid in trials])
    figures["keeper_wakes_per_s"] = percent([f"k{pid}" for pid in keepers], wakes=True) / max(1, len(keepers))
    say(
        f"  CPU over {elapsed:.0f} s (% of one core; noisy on a shared 2-core host): "
        + ", ".join(f"{n} {v['cpu_percent']:.1f} % ({v['rss_mib']:.0f} MiB)" for n, v in figures["services"].items())
        + f"; all keepers {figures['keepers_cpu_percent']:.1f} % ({figures['keeper_wakes_per_s']:.1f} wake-ups/s "
        f"each), all trials {figures['trials_cpu_percent']:.1f} %"
    )
    say(
        "  open files (open / soft limit): "
        + ", ".join(f"{n} {v['open_files'][0]:,} / {v['open_files'][1]:,}" for n, v in figures["services"].items())
    )
    return figures


def stop_all(stack: Stack, experiment: str, count: int, pids: list[tuple[int, int]], say) -> dict:
    """Stop the experiment; seconds until every trial ended, the statuses, and what is left alive."""
    begin = time.perf_counter()
    # The dispatcher asks for each trial's cancel before it answers: give it time at 1,000 trials.
    httpx.delete(f"{stack.api}/experiments/{experiment}", headers=stack.auth, timeout=300).raise_for_status()
    answered = time.perf_counter() - begin

    def all_ended():
        now = counts(stack, experiment)
        return sum(n for s, n in now.items() if s not in ("WAITING", "RUNNING")) == count, now

    wait_for(all_ended, max(120, count * 0.3), "every trial ended", say)
    to_end = time.perf_counter() - begin
    statuses = {status: n for status, n in counts(stack, experiment).items() if n}

    def none_left():
        left = [pid for pair in pids for pid in pair if alive(pid)]
        return not left, f"{len(left)} keeper or trial processes alive"

    wait_for(none_left, 30, "no keeper or trial left", say)
    say(
        f"  stopped: the stop answered in {answered:.1f} s, every trial ended {to_end:.1f} s after it ({statuses}); "
        "no keeper or trial left"
    )
    return {"stop_answer_s": answered, "to_end_s": to_end, "statuses": statuses}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.running", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--command", choices=("python", "sleep"), default="python")
    parser.add_argument("--sleep", type=float, default=60)
    parser.add_argument("--window", type=float, default=20)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an adapter setting, e.g. TRIALBUS_WARM_START=false (repeatable)",
    )
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.set)
    measure_running(args.count, args.command, args.sleep, args.window, adapter_env=settings)


if __name__ == "__main__":
    main()
