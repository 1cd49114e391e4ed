"""The trial keeper as adapters run it: ``python -S -I trial_keeper.py``, a real gateway
process, a real nats-server, and NNI-style trials that use the ``nni`` shim.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import nats
import pytest

import trialbus
from contracts import MetricRecord, subjects
from contracts.metrics import records_of
from services.common.tokens import trial_token
from services.trial_keeper import KEEPER_PATH, SHIM_PATH
from tests.fixtures.nats import NatsServer, free_port

SECRET = "keeper-test-secret"
EXP = "k3x9a2bq"
PARAMETERS = (
    '{"parameter_id": 3, "parameter_source": "algorithm", "parameters": {"x": 0.5, "n": 3}, "parameter_index": 0}'
)

TRIAL = textwrap.dedent(
    """
    import os, sys, time
    import nni

    params = nni.get_next_parameter()
    print("env", sorted(k for k in os.environ if k.startswith(("NNI_", "TRIALBUS_", "CUDA_", "MULTI_"))), flush=True)
    print("cwd", os.getcwd(), flush=True)
    for i in range(params["n"]):
        nni.report_intermediate_result(params["x"] * (i + 1))
    time.sleep(float(os.environ.get("TRIAL_SLEEP", "0")))
    nni.report_final_result({"default": params["x"], "seq": nni.get_sequence_id()})
    print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("TRIAL_EXIT", "0")))
    """
)


class GatewayProcess:
    """``python -m services.metrics_gateway`` on a fixed port, started and stopped at will."""

    def __init__(self, nats_url: str, root: Path) -> None:
        self.port, self.root, self.proc = free_port(), root, None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
        self.env.update(TRIALBUS_NATS_URL=nats_url, TRIALBUS_TRIAL_SECRET=SECRET, TRIALBUS_CONTRACTS_STRICT="1",
                        TRIALBUS_GATEWAY_PORT=str(self.port), TRIALBUS_STOP_TIMEOUT="5")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProcess:
        with open(self.root / "gateway.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "services.metrics_gateway"], env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "gateway.log").read_text()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("gateway did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """A nats-server and a gateway shared by this module's tests (each uses its own trial ids)."""
    root = tmp_path_factory.mktemp("gateway")
    server = NatsServer(root / "jetstream").start()
    gateway = GatewayProcess(server.url, root).start()
    yield gateway, server
    gateway.stop()
    server.stop()


@pytest.fixture
def gateway(running) -> GatewayProcess:
    return running[0]


@pytest.fixture
def nats_url(running) -> str:
    return running[1].url


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    return code


class Trial:
    """One keeper process for one trial; ``state`` is its ``.trialbus/state.json``."""

    def __init__(self, tmp_path: Path, code_dir: Path, gateway_url: str, trial: str, command: str | None = None,
                 keeper: Path = KEEPER_PATH, **env: str) -> None:
        self.id, self.dir = trial, tmp_path / "trials" / trial
        self.env = {
            "PATH": os.environ["PATH"],
            "TRIALBUS_TRIAL_DIR": str(self.dir),
            "TRIALBUS_TRIAL_COMMAND": command or f"{shlex.quote(sys.executable)} trial.py",
            "TRIALBUS_CODE_DIR": str(code_dir),
            "TRIALBUS_EXPERIMENT_ID": EXP,
            "TRIALBUS_TRIAL_ID": trial,
            "TRIALBUS_SEQUENCE_ID": "4",
            "TRIALBUS_PARAMETERS": PARAMETERS,
            "TRIALBUS_GATEWAY_URL": gateway_url,
            "TRIALBUS_TRIAL_TOKEN": trial_token(SECRET, EXP, trial),
            "TRIALBUS_PYTHONPATH_PREPEND": str(SHIM_PATH),
            "TRIALBUS_KILL_GRACE": "0.5",
            "TRIALBUS_FLUSH_TIMEOUT": "20",
            **env,
        }
        self.proc = subprocess.Popen([sys.executable, "-S", "-I", str(keeper)], env=self.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 30) -> int:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        output = self.proc.stdout.read().decode(errors="replace")
        self.proc.stdout.close()
        assert not output, f"the keeper wrote to its own stdout/stderr:\n{output}"
        return self.proc.returncode

    @property
    def state(self) -> dict:
        return json.loads((self.dir / ".trialbus" / "state.json").read_text())

    def read(self, name: str) -> str:
        return (self.dir / name).read_text()

    def wait_for(self, predicate, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out; keeper log:\n{self.read('.trialbus/keeper.log')}"
            time.sleep(0.02)


def stored(nats_url: str, trial: str) -> list[MetricRecord]:
    """The trial's records in the METRICS stream, in stream order."""

    async def read() -> list[MetricRecord]:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            info = await js.stream_info("METRICS", subjects_filter=subjects.metrics(EXP, trial))
            count = (info.state.subjects or {}).get(subjects.metrics(EXP, trial), 0)
            sub = await js.subscribe(subjects.metrics(EXP, trial), ordered_consumer=True) if count else None
            msgs = [await sub.next_msg(timeout=5) for _ in range(count)]
            return [record for msg in msgs for record in records_of(msg.data)]
        finally:
            await nc.close()

    return asyncio.run(read())


def group_is_gone(pgid: int) -> bool:
    """No live process in the group (killed ones may linger as zombies until init reaps them)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True


def summary(records: list[MetricRecord]) -> list[tuple[str, int, object]]:
    return [(r.type.value, r.sequence, r.decoded()) for r in records]


EXPECTED = [("PERIODICAL", 0, 0.5), ("PERIODICAL", 1, 1.0), ("PERIODICAL", 2, 1.5),
            ("FINAL", 0, {"default": 0.5, "seq": 4})]


def test_file_channel_trial_reports_through_the_gateway(tmp_path, code_dir, gateway, nats_url):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tfile1")
    assert trial.wait() == 0
    state = trial.state
    assert state["done"] is True and state["metricsFlushed"] is True
    assert (state["exitCode"], state["canceled"], state["error"]) == (0, False, None)
    assert state["startTime"] <= state["endTime"] and state["pgid"] == state["trialPid"]
    assert summary(stored(nats_url, "Tfile1")) == EXPECTED
    # The trial saw NNI's environment (and never the keeper's secrets), in its code directory
    out = trial.read("stdout")
    assert "env ['MULTI_PHASE', 'NNI_CODE_DIR', 'NNI_EXP_ID', 'NNI_OUTPUT_DIR', 'NNI_PLATFORM', 'NNI_SYS_DIR', " \
           "'NNI_TRIAL_JOB_ID', 'NNI_TRIAL_SEQ_ID']" in out
    assert f"cwd {code_dir}" in out
    assert trial.read("stderr") == "to stderr\n"
    assert trial.read("parameter.cfg") == PARAMETERS
    exit_code, millis = trial.read(".nni/state").split()
    assert exit_code == "0" and abs(int(millis) / 1000 - state["endTime"]) < 1
    assert not (trial.dir / ".trialbus" / "keeper.log").exists()  # nothing went wrong: nothing to log


def test_stdout_channel_trial_reports_through_the_gateway(tmp_path, code_dir, gateway, nats_url):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tout1", TRIALBUS_NNI_PLATFORM="remote", TRIALBUS_GPUS="")
    assert trial.wait() == 0
    assert trial.state["metricsFlushed"] is True
    assert summary(stored(nats_url, "Tout1")) == EXPECTED
    assert trial.read("stdout").count("NNISDK_MEb'") == 4  # the output is kept whole
    assert "CUDA_VISIBLE_DEVICES" in trial.read("stdout")
    assert not (trial.dir / ".nni" / "metrics").exists()
    assert trial.read(".nni/state").startswith("0 ")  # NNI's layout all the same


def test_exit_codes_are_recorded(tmp_path, code_dir, gateway):
    failed = Trial(tmp_path, code_dir, gateway.url, "Texit3", TRIAL_EXIT="3")
    killed = Trial(tmp_path, code_dir, gateway.url, "Tsig9", command="kill -9 $$")
    assert failed.wait() == 3
    assert (failed.state["exitCode"], failed.state["metricsFlushed"]) == (3, True)
    assert failed.read(".nni/state").startswith("3 ")
    assert killed.wait() == 128 + 9
    assert killed.state["exitCode"] == -9
    assert killed.read(".nni/state").startswith("-9 ")


def test_a_plain_command_runs_without_a_shell(tmp_path, code_dir, gateway):
    (code_dir / "pid.py").write_text("import os\nprint(os.getpid())\n")
    trial = Trial(tmp_path, code_dir, gateway.url, "Tdirect", command=f"{shlex.quote(sys.executable)} pid.py")
    assert trial.wait() == 0
    assert int(trial.read("stdout")) == trial.state["trialPid"]  # the program itself, no /bin/sh between


def test_a_command_that_needs_a_shell_gets_one(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tshell", command='echo "$NNI_TRIAL_JOB_ID" | tr a-z A-Z')
    assert trial.wait() == 0
    assert trial.read("stdout") == "TSHELL\n"


def test_an_unknown_program_fails_127_with_the_shells_message(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tmissing", command="no-such-program-x1 --lr 0.1")
    assert trial.wait() == 127
    assert "no-such-program-x1" in trial.read("stderr") and "not found" in trial.read("stderr")
    assert trial.state["exitCode"] == 127


def test_what_the_trial_leaves_behind_is_killed(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Torphan", command="sleep 300 & echo started")
    assert trial.wait() == 0
    assert trial.read("stdout") == "started\n"
    assert group_is_gone(trial.state["pgid"])


def test_sigterm_stops_the_whole_group(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tterm", command="sleep 300 & sleep 300 & echo up; wait")
    trial.wait_for(lambda: (trial.dir / "stdout").exists() and trial.read("stdout") == "up\n")
    trial.proc.send_signal(signal.SIGTERM)
    assert trial.wait(10) == 128 + signal.SIGTERM
    state = trial.state
    assert (state["canceled"], state["exitCode"], state["done"]) == (True, -signal.SIGTERM, True)
    assert group_is_gone(state["pgid"])


def test_a_trial_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tstub", command="trap '' TERM; echo up; sleep 300")
    trial.wait_for(lambda: (trial.dir / "stdout").exists() and trial.read("stdout") == "up\n")
    started = time.monotonic()
    trial.proc.send_signal(signal.SIGINT)
    assert trial.wait(10) == 128 + signal.SIGKILL
    assert 0.4 < time.monotonic() - started < 5  # TRIALBUS_KILL_GRACE=0.5
    assert (trial.state["canceled"], trial.state["exitCode"]) == (True, -signal.SIGKILL)
    assert group_is_gone(trial.state["pgid"])


def test_two_stop_signals_at_once_are_one_stop_and_a_later_one_kills_at_once(tmp_path, code_dir, gateway):
    # In a container the keeper may get a pod's SIGTERM twice (its group's, and its task shell's, passed on)
    trial = Trial(tmp_path, code_dir, gateway.url, "Ttwice", command="trap '' TERM; echo up; sleep 300",
                  TRIALBUS_KILL_GRACE="3")  # fmt: skip
    trial.wait_for(lambda: (trial.dir / "stdout").exists() and trial.read("stdout") == "up\n")
    trial.proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    trial.proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)
    assert trial.proc.poll() is None, "the second signal of one stop must not cut the grace period short"
    stopped = time.monotonic()
    trial.proc.send_signal(signal.SIGTERM)  # a second stop, later: the user insists
    assert trial.wait(10) == 128 + signal.SIGKILL
    assert time.monotonic() - stopped < 1.0
    assert group_is_gone(trial.state["pgid"])


def test_metrics_are_spooled_while_the_gateway_is_down_and_delivered_once(tmp_path, code_dir, nats_server):
    # Given no gateway when the trial starts and reports
    gateway = GatewayProcess(nats_server.url, tmp_path)
    trial = Trial(tmp_path, code_dir, gateway.url, "Tspool", TRIAL_SLEEP="0.3")
    spool = trial.dir / ".trialbus" / "spool"
    trial.wait_for(lambda: spool.exists() and any(spool.iterdir()))
    # when the gateway comes up (the trial may have ended meanwhile)
    try:
        gateway.start()
        # then every record arrives, exactly once and in order, and the spool is emptied
        assert trial.wait() == 0
    finally:
        gateway.stop()
    assert trial.state["metricsFlushed"] is True
    assert summary(stored(nats_server.url, "Tspool")) == EXPECTED
    assert not any(spool.iterdir())
    assert "retrying" in trial.read(".trialbus/keeper.log")


def test_the_flush_gives_up_after_the_flush_timeout(tmp_path, code_dir):
    trial = Trial(tmp_path, code_dir, f"http://127.0.0.1:{free_port()}", "Tgone", TRIALBUS_FLUSH_TIMEOUT="0.5")
    assert trial.wait() == 0
    state = trial.state
    assert (state["exitCode"], state["metricsFlushed"], state["done"]) == (0, False, True)
    spooled = b"".join(p.read_bytes() for p in sorted((trial.dir / ".trialbus" / "spool").iterdir()))
    assert spooled.count(b"ME0") == 4  # nothing lost: the records wait on disk


def test_a_keeper_of_another_version_stops_its_trial(tmp_path, code_dir, gateway):
    old = tmp_path / "trial_keeper.py"
    old.write_text(KEEPER_PATH.read_text().replace(f'VERSION = "{trialbus.__version__}"', 'VERSION = "9.9.0"'))
    trial = Trial(tmp_path, code_dir, gateway.url, "Tvers", command="sleep 300", keeper=old)
    assert trial.wait(10) == 128 + signal.SIGTERM
    state = trial.state
    assert "409" in state["error"] and "9.9.0" in state["error"] and trialbus.__version__ in state["error"]
    assert (state["canceled"], state["metricsFlushed"]) == (False, True)
    assert group_is_gone(state["pgid"])


def test_a_short_trial_of_another_version_is_refused_by_its_first_batch(tmp_path, code_dir, gateway, nats_url):
    old = tmp_path / "trial_keeper.py"
    old.write_text(KEEPER_PATH.read_text().replace(f'VERSION = "{trialbus.__version__}"', 'VERSION = "9.9.0"'))
    trial = Trial(tmp_path, code_dir, gateway.url, "Tvers2", keeper=old)
    trial.wait(10)
    state = trial.state
    assert "409" in state["error"] and "9.9.0" in state["error"] and trialbus.__version__ in state["error"]
    assert stored(nats_url, "Tvers2") == []


def test_a_refused_token_stops_sending_but_not_the_trial(tmp_path, code_dir, gateway, nats_url):
    trial = Trial(tmp_path, code_dir, gateway.url, "Ttoken", TRIALBUS_TRIAL_TOKEN="0" * 64)
    assert trial.wait() == 0
    state = trial.state
    assert "401" in state["error"] and state["metricsFlushed"] is False and state["exitCode"] == 0
    assert stored(nats_url, "Ttoken") == []


def test_batches_are_split_on_413_and_bad_records_dropped_on_400(tmp_path, code_dir, nats_server):
    # Given a gateway that takes at most 3 records or 200 kB per request
    gateway = GatewayProcess(nats_server.url, tmp_path)
    gateway.env.update(TRIALBUS_GATEWAY_MAX_RECORDS="3", TRIALBUS_GATEWAY_MAX_BODY=str(200_000))
    (code_dir / "big.py").write_text(textwrap.dedent(
        """
        import json
        for i in range(40):  # 40 x 30 kB: more than a batch of the keeper, far more than the gateway takes
            record = {"parameter_id": 1, "trial_job_id": "Tsplit", "type": "PERIODICAL", "sequence": i,
                      "value": json.dumps("x" * 30000)}
            print("NNISDK_MEb'%s'" % json.dumps(record))
            if i == 20:  # and one record that is not for this trial
                print("NNISDK_MEb'%s'" % json.dumps(dict(record, trial_job_id="Other")))
        """
    ))
    try:
        gateway.start()
        # when a trial reports through the stdout channel
        trial = Trial(tmp_path, code_dir, gateway.url, "Tsplit", command=f"{shlex.quote(sys.executable)} big.py",
                      TRIALBUS_NNI_PLATFORM="remote")
        assert trial.wait() == 0
    finally:
        gateway.stop()
    # then every good record arrives once, in order, and the bad one is dropped and logged
    assert [r.sequence for r in stored(nats_server.url, "Tsplit")] == list(range(40))
    assert trial.state["metricsFlushed"] is True
    assert "gateway refused (400)" in trial.read(".trialbus/keeper.log")


QUIET_TRIAL = textwrap.dedent(
    """
    import os, time
    import nni

    nni.get_next_parameter()
    nni.report_intermediate_result(1.0)
    time.sleep(4)
    with open("written", "w") as f:
        f.write(repr(time.time()))
    nni.report_intermediate_result(2.0)
    time.sleep(0.5)
    """
)


def wakeups(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def test_a_quiet_trial_keeper_sleeps_and_its_next_record_is_relayed_at_once(tmp_path, gateway, nats_url):
    """The kernel wakes the keeper at the quiet trial's next write (dnotify), so it need not read
    the metrics file every TICK_MAX: 1,000 sleeping trials cost 1,000 keepers that sleep."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "quiet.py").write_text(QUIET_TRIAL)
    trial = Trial(tmp_path, code, gateway.url, "Tquiet", f"{shlex.quote(sys.executable)} quiet.py")
    trial.wait_for(lambda: len(stored(nats_url, "Tquiet")) == 1)
    time.sleep(1)  # the keeper's ticks have grown to their longest
    before = wakeups(trial.proc.pid)
    time.sleep(2)
    assert wakeups(trial.proc.pid) - before <= 2  # reading its file every TICK_MAX (0.4 s) is 5

    trial.wait_for(lambda: len(stored(nats_url, "Tquiet")) == 2)
    relayed = time.time()
    assert relayed - float((code / "written").read_text()) < 1.0  # not after QUIET_TICK (5 s)
    assert trial.wait() == 0 and trial.state["metricsFlushed"] is True


class LosingProxy:
    """Between a keeper and the gateway: forwards every request, but answers the first one with
    a 503 after the gateway took it (its answer lost on the way back)."""

    def __init__(self, gateway_url: str) -> None:
        import http.server
        import threading

        self.forwarded = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.post(gateway_url + self.path, content=body, headers=headers, timeout=10)
                proxy.forwarded += 1
                status, data = (503, b'{"error": "lost"}') if proxy.forwarded == 1 else (answer.status_code,
                                                                                        answer.content)
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_batch_whose_answer_was_lost_is_resent_as_it_was_and_stored_once(tmp_path, code_dir, gateway, nats_url):
    # Given a trial that reports more records at once than a keeper sends in one batch
    (code_dir / "many.py").write_text(textwrap.dedent(
        """
        import nni
        nni.get_next_parameter()
        for i in range(800):
            nni.report_intermediate_result(i)
        nni.report_final_result(800)
        """
    ))
    proxy = LosingProxy(gateway.url)
    try:
        # when the gateway's answer to the first batch is lost
        trial = Trial(tmp_path, code_dir, proxy.url, "Tlost", command=f"{shlex.quote(sys.executable)} many.py")
        assert trial.wait() == 0
    finally:
        proxy.server.shutdown()
    # then the keeper sent that batch again as it was (not merged with the records after it): the
    # stream dropped the repeat, and holds each record once
    assert proxy.forwarded >= 3 and "retrying" in trial.read(".trialbus/keeper.log")
    records = [(r.type.value, r.sequence) for r in stored(nats_url, "Tlost")]
    assert records == [*(("PERIODICAL", i) for i in range(800)), ("FINAL", 0)]
    assert trial.state["metricsFlushed"] is True
