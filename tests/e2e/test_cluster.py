"""``trialbus up --cluster 3``: NATS as production runs it, a JetStream cluster of three servers
with every stream and bucket at 3 replicas, and what a server's death does to a running
experiment: nothing lost, nothing twice, no service restarted.

``make failover`` (bench/failover.py) is the long version with the pause measured.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import nats
import pytest
from rich.console import Console
from typer.testing import CliRunner

from contracts import MetricRecord, streams
from contracts.metrics import records_of
from tests.e2e.conftest import config, runs, write_code
from tests.e2e.helpers import create, submit, wait_until
from tests.fixtures.nats import free_port, nats_server_binary, require_binary
from tests.fixtures.standins import MODULES
from tests.fixtures.up import TRIALBUS, Up, new_ports
from trialbus import local
from trialbus.cli import app
from trialbus.stack import ServiceDef, Stack, StackError, StackOptions

pytestmark = pytest.mark.timeout(180)

#: Every stream of the bus: the three streams, the KV buckets, the code store.
STREAMS = [c.name for c in streams.STREAMS] + [f"KV_{c.bucket}" for c in streams.BUCKETS]
STREAMS.append(f"OBJ_{streams.CODE_STORE.bucket}")
#: A service that shows what the stack gives it.
ENV_SHOW = (
    "-c",
    "import os, time; print('sees', os.environ['TRIALBUS_NATS_URL'], "
    "os.environ['TRIALBUS_STREAM_REPLICAS'], flush=True); time.sleep(600)",
)


# -- the option --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "why"),
    [(2, "odd number of servers, 3 or more"), (4, "a quorum is 3 of 4"), (7, "at most 5 servers"), (0, "at least one")],
)
def test_a_cluster_of_an_even_or_impossible_size_is_refused_with_the_reason(size: int, why: str) -> None:
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["up", "--cluster", str(size)])
    assert result.exit_code == 2 and "--cluster" in result.output and why in result.output, result.output
    with pytest.raises(StackError, match=why):
        StackOptions(cluster=size)


# -- the configuration, over stand-in services -------------------------------------------------


def monitor(node_config: Path) -> str:
    """A node's monitoring address, as its configuration names it."""
    line = next(line for line in node_config.read_text().splitlines() if line.startswith("http:"))
    return "http://" + json.loads(line.split(":", 1)[1])


def test_a_cluster_of_three_forms_with_private_routes_and_every_service_sees_every_server(tmp_path: Path) -> None:
    require_binary(nats_server_binary(), "nats-server")
    options = StackOptions(
        data_dir=tmp_path / "data",
        nats_port=free_port(),
        api_port=free_port(),
        gateway_port=free_port(),
        webui_port=free_port(),
        cluster=3,
        start_timeout=30,
        stop_grace=5,
        settle=0.3,
    )
    console = Console(file=io.StringIO(), width=200)
    web = ServiceDef("web", ("-c", MODULES["web"]), {"PORT": "{api_port}"}, health="http://{host}:{api_port}/healthz")
    stack = Stack(options, console, (web, ServiceDef("shows", ENV_SHOW)))

    # When the stack starts with three nats-servers
    stack.start()
    try:
        data = stack.data_dir
        names = ["nats-server-1", "nats-server-2", "nats-server-3"]
        assert [p.name for p in stack.parts[:3]] == names
        # Then each has its own store, its own name, routes to all three, and is ready: one cluster,
        # one meta leader
        for name in names:
            conf = data / f"{name}.conf"
            text = conf.read_text()
            assert stat.S_IMODE(conf.stat().st_mode) == 0o600, "it holds the route password"
            assert f'server_name: "{name}"' in text and f"nats-cluster/{name}" in text
            assert "include nats-auth.conf" in text and text.count("nats://route:") == 3
            meta = httpx.get(f"{monitor(conf)}/jsz", timeout=5).json()["meta_cluster"]
            assert meta["cluster_size"] == 3 and meta["leader"] in names
        # And the first is on --nats-port: clients and services get all three, and 3 replicas
        urls = local.find(data).nats_url.split(",")
        assert urls[0] == options.nats_url and len(set(urls)) == 3
        wait_until(lambda: "sees" in (data / "logs/shows.log").read_text(), 10, "the service's line")
        assert (data / "logs/shows.log").read_text().split() == ["sees", ",".join(urls), "3"]
        # And a route without the password is refused: a local user cannot join as a server
        route = int(
            next(
                line
                for line in (data / "nats-server-2.conf").read_text().splitlines()
                if "listen:" in line and line.startswith("  ")
            )
            .rsplit(":", 1)[1]
            .strip('"')
        )
        with socket.create_connection(("127.0.0.1", route), timeout=5) as s:
            s.recv(4096)  # INFO
            s.sendall(b'CONNECT {"verbose":false,"pedantic":false,"name":"intruder","cluster":"trialbus"}\r\nPING\r\n')
            assert b"Authorization Violation" in s.recv(4096)
        # And no log holds the route password
        password = (data / "nats-server-1.conf").read_text().split("nats://route:")[1].split("@")[0]
        assert not any(password in log.read_text() for log in (data / "logs").iterdir())
    finally:
        stack.stop()

    # And a later `up` of another size is refused: the stores remember a cluster of 3
    with pytest.raises(StackError, match=r"a cluster of 3 servers.*--cluster 3"):
        Stack(StackOptions(**{**options.__dict__, "cluster": 5}), console, ()).start()


# -- the failover ------------------------------------------------------------------------------


async def bus(up: Up):
    """The stack's bus as its dispatcher sees it (the user that may look at every stream)."""
    password = json.loads((up.data_dir / "nats-passwords.json").read_text())["dispatcher"]
    return await nats.connect(
        up.nats_urls.split(","),
        user="dispatcher",
        password=password,
        inbox_prefix="_INBOX_dispatcher",
        max_reconnect_attempts=-1,
    )


async def replicas(up: Up) -> dict[str, tuple[int, int]]:
    """Each stream's replicas as configured, and the servers that hold a current copy."""
    nc = await bus(up)
    try:
        found = {}
        for name in STREAMS:
            info = await nc.jetstream().stream_info(name)
            copies = [info.cluster.leader] + [r.name for r in info.cluster.replicas or [] if r.current]
            found[name] = (info.config.num_replicas, len(set(copies)))
        return found
    finally:
        await nc.close()


async def metrics_leader(up: Up) -> tuple[str | None, int]:
    """The server leading METRICS and the messages it holds; None while it has no leader."""
    nc = await bus(up)
    try:
        info = await nc.jetstream(timeout=1).stream_info("METRICS")
        return info.cluster.leader, info.state.messages
    except (nats.errors.Error, TimeoutError):
        return None, 0
    finally:
        await nc.close()


async def metric_records(up: Up, experiment: str) -> list[MetricRecord]:
    """Every record of the experiment in METRICS, duplicates included."""
    nc = await bus(up)
    try:
        js = nc.jetstream()
        subject = f"metrics.{experiment}.>"
        total = sum(((await js.stream_info("METRICS", subjects_filter=subject)).state.subjects or {}).values())
        sub = await js.subscribe(subject, stream="METRICS", ordered_consumer=True)
        records = [r for _ in range(total) for r in records_of((await sub.next_msg(timeout=10)).data)]
        await sub.unsubscribe()
        return records
    finally:
        await nc.close()


def test_the_metrics_leader_killed_mid_run_loses_nothing_duplicates_nothing_restarts_no_service(tmp_path: Path):
    require_binary(nats_server_binary(), "nats-server")
    code, run_log = write_code(tmp_path), tmp_path / "runs.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_") or k == "TRIALBUS_TRIAL_USER"}
    up = Up(
        tmp_path / "data",
        new_ports(),
        {**env, "RUN_LOG": str(run_log), "COLUMNS": "300"},
        tmp_path / "up.log",
        ["--cluster", "3"],
    )
    try:
        # Given `trialbus up --cluster 3`: every stream, bucket and the code store on all three servers
        up.wait_for("Trialbus is up", 90)
        assert asyncio.run(replicas(up)) == {name: (3, 3) for name in STREAMS}

        # And an experiment whose 8 trials report 16 intermediate results each, 4 at a time
        experiment = create(up, config(code, trialConcurrency=4, maxTrialNumber=8))
        ids = [submit(up, experiment, {"x": i, "intermediate": 16, "pause": 0.3}) for i in range(8)]
        trials = f"/experiments/{experiment}/trials"
        wait_until(
            lambda: sum(t["intermediateCount"] > 2 for t in up.rest("GET", trials).json()["trials"]) >= 2,
            60,
            "trials reporting",
        )

        # When the server leading METRICS is killed -9 and stays down while the trials go on
        leader, _ = asyncio.run(metrics_leader(up))
        killed = up.processes()[leader]
        with up.held():  # `trialbus up`, still: it would restart the server in half a second
            killed.kill()
            new_leader, stored = wait_until(
                lambda: (found := asyncio.run(metrics_leader(up)))[0] not in (None, leader) and found,
                30,
                "a new METRICS leader",
            )
            wait_until(lambda: asyncio.run(metrics_leader(up))[1] > stored + 4, 20, "metrics stored with one down")
        # And `trialbus up` restarts it on its store: it rejoins and catches up
        wait_until(lambda: up.back(leader, killed.pid), 60, f"{leader} back")

        # Then every trial succeeded, ran once, with each metric once in the stream and in its view
        wait_until(lambda: up.rest("GET", f"/experiments/{experiment}").json()["status"] == "DONE", 90, "DONE")
        final = up.rest("GET", trials).json()["trials"]
        assert [t["status"] for t in final] == ["SUCCEEDED"] * 8, final
        assert all(t["intermediateCount"] == 16 and t["finalMetric"] is not None for t in final), final
        assert sorted(runs(run_log)) == sorted(ids)
        records = asyncio.run(metric_records(up, experiment))
        assert Counter(r.trial_id for r in records) == Counter({i: 17 for i in ids})
        assert len({(r.trial_id, r.type, r.sequence) for r in records}) == len(records), "a sequence twice"

        # And no service was restarted; only the killed server was, once; all three hold every stream again
        status = subprocess.run(
            [TRIALBUS, "status", "--json", "--data-dir", str(up.data_dir)], capture_output=True, text=True, timeout=30
        )
        restarts = {p["name"]: p["restarts"] for p in json.loads(status.stdout)["parts"]}
        assert restarts == {name: int(name == leader) for name in restarts}, restarts
        assert new_leader != leader and len(restarts) > 3
        assert asyncio.run(replicas(up)) == {name: (3, 3) for name in STREAMS}
    except BaseException:
        print(up.text(), file=sys.stderr)
        raise
    finally:
        up.ctrl_c()
        try:
            assert up.wait(60) == 0
        finally:
            up.kill()


def test_a_client_given_any_of_the_clusters_servers_uses_the_stacks_user_and_no_other(
    tmp_path: Path, monkeypatch
) -> None:
    # Given a cluster's client.json, which lists every server
    found = local.LocalStack(
        nats_url="nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224",
        nats_user="client",
        nats_password="p1",
        api_url="",
        webui_url="",
    )
    local.write(tmp_path, found)
    monkeypatch.setenv("TRIALBUS_DATA_DIR", str(tmp_path))
    # Then a client given all of them, or one, uses its user; one given another server too does not
    assert local.credentials_for(found.nats_url) == ("client", "p1")
    assert local.credentials_for("nats://localhost:4223") == ("client", "p1")
    assert local.credentials_for("nats://127.0.0.1:4223,nats://elsewhere:4222") is None
    assert local.credentials_for("nats://127.0.0.1:4225") is None
