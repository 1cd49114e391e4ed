"""How a keeper's records reach the gateway, as adapters run it (``python -S -I trial_keeper.py``,
a real gateway process, a real nats-server): spooled while the gateway is down, resent as they were,
split on 413, refused versions and tokens, and a quiet trial's keeper asleep until the trial writes.
"""

from __future__ import annotations

import shlex
import signal
import sys
import textwrap
import time

import httpx

import trialbus
from services.trial_keeper import KEEPER_PATH
from tests.fixtures.keeper import (  # noqa: F401 - fixtures: running, gateway, nats_url, code_dir
    EXPECTED,
    GatewayProcess,
    Trial,
    code_dir_fixture,
    gateway_fixture,
    group_is_gone,
    nats_url_fixture,
    running_fixture,
    stored,
    summary,
)
from tests.fixtures.nats import free_port


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
    (code_dir / "big.py").write_text(
        textwrap.dedent(
            """
        import json
        for i in range(40):  # 40 x 30 kB: more than a batch of the keeper, far more than the gateway takes
            record = {"parameter_id": 1, "trial_job_id": "Tsplit", "type": "PERIODICAL", "sequence": i,
                      "value": json.dumps("x" * 30000)}
            print("NNISDK_MEb'%s'" % json.dumps(record))
            if i == 20:  # and one record that is not for this trial
                print("NNISDK_MEb'%s'" % json.dumps(dict(record, trial_job_id="Other")))
        """
        )
    )
    try:
        gateway.start()
        # when a trial reports through the stdout channel
        trial = Trial(
            tmp_path,
            code_dir,
            gateway.url,
            "Tsplit",
            command=f"{shlex.quote(sys.executable)} big.py",
            TRIALBUS_NNI_PLATFORM="remote",
        )
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
                status, data = (
                    (503, b'{"error": "lost"}') if proxy.forwarded == 1 else (answer.status_code, answer.content)
                )
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
    (code_dir / "many.py").write_text(
        textwrap.dedent(
            """
        import nni
        nni.get_next_parameter()
        for i in range(800):
            nni.report_intermediate_result(i)
        nni.report_final_result(800)
        """
        )
    )
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
