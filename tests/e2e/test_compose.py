"""``docker compose up`` for real: the image built as users build it, and compose.yaml run on a
real Docker engine with Compose v2 and v1, driven from the host with the CLI and REST.

The engine, the images and Compose come from :mod:`tests.fixtures.docker` (an engine started as
root where there is none, a base image made offline, the wheelhouse); a laptop without Docker
skips, ``CI=true`` fails. ``make compose-test`` runs this file on its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from datetime import datetime

import nats
import nats.errors
import pytest
import yaml

from contracts import streams
from services.common.bus import bootstrap
from tests.e2e.helpers import wait_until
from tests.fixtures import docker as engine
from tests.fixtures.compose import TRIALBUS, ComposeProject, compose_project
from tests.fixtures.kubernetes import container_commands, operator_tree, render_with_image

pytestmark = pytest.mark.timeout(900)

ROOT = engine.ROOT
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
#: Compose's services and the NATS user each connects as (the default profile: no emulators).
USERS = {
    name: spec["environment"]["TRIALBUS_NATS_USER"]
    for name, spec in COMPOSE["services"].items()
    if name != "nats" and not spec.get("profiles")
}
NATS_HEALTH_INTERVAL = 5.0  # compose.yaml: the nats healthcheck's interval, so its first check
TERMINAL = {"SUCCEEDED", "FAILED", "EARLY_STOPPED", "USER_CANCELED", "SYS_CANCELED"}

#: An NNI trial long enough to be killed mid-run: 8 intermediate results 0.5 s apart, then the final.
SLOW_TRIAL = """\
import time
import nni

params = nni.get_next_parameter()
for step in range(8):
    time.sleep(0.5)
    nni.report_intermediate_result(params["x"] * step)
nni.report_final_result(params["x"])
"""
SLOW_CONFIG = """\
experimentName: compose-kill
trialCommand: python3 trial.py
trialCodeDirectory: .
trialConcurrency: 6
maxTrialNumber: 18
searchSpace:
  x: {_type: uniform, _value: [0, 1]}
tuner:
  name: Random
trainingService:
  platform: local
"""


def report(text: str) -> None:
    print(f"\n[compose] {text}", flush=True)


@pytest.fixture(scope="module")
def images() -> engine.Images:
    return engine.images()


def created(output: str) -> str:
    found = re.search(r"created experiment (\w+)", output)
    assert found, output
    return found.group(1)


def trials_of(project: ComposeProject, experiment: str) -> list[dict]:
    reply = project.rest("GET", f"/experiments/{experiment}/trials")
    assert reply.status_code == 200, reply.text
    return reply.json()["trials"]


def assert_started_after_a_healthy_nats(project: ComposeProject) -> None:
    """depends_on ``service_healthy``: no service starts before nats passed its first healthcheck,
    which runs one interval after nats started."""
    nats_started = project.containers("nats")[0].attrs["State"]["StartedAt"]
    for c in project.containers():
        if c.labels["com.docker.compose.service"] != "nats":
            gap = seconds(c.attrs["State"]["StartedAt"]) - seconds(nats_started)
            assert gap >= NATS_HEALTH_INTERVAL - 0.5, f"{c.name} started {gap:.1f}s after nats, before it was healthy"


def seconds(stamp: str) -> float:
    """Docker's RFC 3339 time with nanoseconds, as seconds since the epoch."""
    day, _, rest = stamp.rstrip("Z").partition("T")
    clock, _, fraction = rest.partition(".")
    return datetime.fromisoformat(f"{day}T{clock}+00:00").timestamp() + float(f"0.{fraction or 0}")


def assert_each_service_is_its_own_nats_user(project: ComposeProject) -> None:
    """nats-server's own list of connections: every service connected as its user of auth.conf."""
    nats_container = project.containers("nats")[0]
    out = nats_container.exec_run(["wget", "-q", "-O", "-", "http://127.0.0.1:8222/connz?auth=true&limit=1024"])
    assert out.exit_code == 0, out.output
    users = {c.get("authorized_user") for c in json.loads(out.output)["connections"]}
    assert set(USERS.values()) <= users, f"missing NATS users: {set(USERS.values()) - users}"


async def assert_the_client_user_cannot_dispatch(project: ComposeProject) -> None:
    env = project.client_env()
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(
        env["TRIALBUS_NATS_URL"],
        user="client",
        password=env["TRIALBUS_NATS_PASSWORD"],
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        await nc.publish("dispatch.local-gpu", b"{}")
        await nc.flush()
        deadline = time.monotonic() + 5
        while not errors and time.monotonic() < deadline:
            await nc.flush()
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    assert any("permissions violation" in str(e).lower() for e in errors), errors


def test_the_image_runs_as_an_unprivileged_user_without_build_tools(images):
    client = engine.docker_client()
    image = client.images.get(images.trialbus)
    assert image.attrs["Config"]["User"] == "10001:10001"
    report(
        f"image {images.trialbus}: {engine.image_size(images.trialbus) / 1e6:.0f} MB "
        f"(base {engine.image_size(engine.BASE_IMAGE) / 1e6:.0f} MB)"
    )
    probe = "for t in gcc cc make pip pip3; do command -v $t; done; id -u; python -c 'import services, trialbus'"
    out = engine.output_of(images.trialbus, ["sh", "-c", probe])
    assert out.split() == ["10001"], f"build tools in the image, or not uid 10001: {out}"


def test_the_nats_image_starts_as_the_official_one_and_holds_our_streams(images):
    """Started by testcontainers as its NATS module starts the official image (``-js``, ready when it
    logs "Server is ready"), the one the suite makes in its place holds every stream and bucket of ours."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    async def bootstrap_on(url: str) -> set[str]:
        nc = await nats.connect(url)
        try:
            await bootstrap(nc.jetstream())
            return {info.config.name for info in await nc.jetstream().streams_info()}
        finally:
            await nc.close()

    server = DockerContainer(images.nats).with_command("-js").with_exposed_ports(4222)
    with server.waiting_for(LogMessageWaitStrategy("Server is ready")):
        made = asyncio.run(bootstrap_on(f"nats://{server.get_container_host_ip()}:{server.get_exposed_port(4222)}"))
    assert {s.name for s in streams.STREAMS} | {f"KV_{b.bucket}" for b in streams.BUCKETS} <= made, made


def test_buildkit_builds_the_same_image_from_the_same_dockerfile(images):
    client = engine.docker_client()
    classic, buildkit = (client.images.get(tag).attrs["Config"] for tag in (images.trialbus, engine.IMAGE_BUILDKIT))
    for key in ("User", "Cmd", "Env", "WorkingDir", "ExposedPorts", "Volumes"):
        assert classic[key] == buildkit[key], key
    out = engine.output_of(engine.IMAGE_BUILDKIT, ["python", "-c", "import services.dispatcher; print('ok')"])
    assert out.strip() == "ok"
    sizes = [engine.image_size(tag) for tag in (images.trialbus, engine.IMAGE_BUILDKIT)]
    assert abs(sizes[0] - sizes[1]) < 0.05 * sizes[0], sizes


def test_compose_v2_runs_an_nni_config_spreads_it_over_three_replicas_and_survives_a_killed_one(images, tmp_path):
    with compose_project("trialbus-test-v2", 2, images, tmp_path) as project:
        took = project.up(scale={"local-gpu": 3})
        report(f"compose v2: up → every container healthy in {took:.1f}s")
        assert_started_after_a_healthy_nats(project)
        assert_each_service_is_its_own_nats_user(project)
        asyncio.run(assert_the_client_user_cannot_dispatch(project))

        # An NNI config as written for NNI, run with the CLI from the host
        done = project.trialbus("experiment", "run", "-f", str(ROOT / "examples/nni-tpe/config.yml"))
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"DONE after .*40 succeeded|DONE after .*succeeded.*early_stopped", done.stdout), done.stdout
        trials = trials_of(project, created(done.stdout))
        assert len(trials) == 40 and {t["status"] for t in trials} <= {"SUCCEEDED", "EARLY_STOPPED"}
        replicas = {c.attrs["Config"]["Hostname"]: c for c in project.containers("local-gpu")}
        spread = Counter(t["replica"] for t in trials)
        report(f"40 trials over the local-gpu replicas: {dict(spread)}")
        assert set(spread) == set(replicas), f"trials ran on {dict(spread)}, replicas are {sorted(replicas)}"

        # A replica killed mid-run (as by the OOM killer): compose restarts it, it adopts what it
        # ran, every trial ends, and no metric is lost or repeated
        code = tmp_path / "slow"
        code.mkdir()
        (code / "trial.py").write_text(SLOW_TRIAL)
        (code / "config.yml").write_text(SLOW_CONFIG)
        cli = [TRIALBUS, "experiment", "run", "-f", str(code / "config.yml")]
        env = project.client_env()
        run = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            experiment = wait_until(lambda: experiment_named(project, "compose-kill"), 60, "the experiment")
            running = wait_until(
                lambda: [t for t in trials_of(project, experiment) if t["status"] == "RUNNING" and t["replica"]],
                60,
                "running trials",
            )
            victim_name = running[0]["replica"]
            victim = replicas[victim_name]
            seen_running = sum(t["replica"] == victim_name for t in running)
            os.kill(victim.attrs["State"]["Pid"], signal.SIGKILL)
            killed_at = time.monotonic()
            output, _ = run.communicate(timeout=240)
        finally:
            run.kill()
        assert run.returncode == 0, output
        victim.reload()
        assert victim.attrs["RestartCount"] >= 1 and victim.attrs["State"]["Status"] == "running", victim.attrs["State"]
        project.wait_healthy(time.monotonic() + 60)
        after = time.monotonic() - killed_at
        report(
            f"killed {victim.name} with {seen_running} trial(s) seen running; restarted by compose "
            f"{victim.attrs['RestartCount']}x; the experiment was done {after:.1f}s later"
        )

        trials = trials_of(project, experiment)
        assert len(trials) == 18 and all(t["status"] in TERMINAL for t in trials), [t["status"] for t in trials]
        for t in trials:
            metrics = project.rest("GET", f"/trials/{t['id']}/metrics").json()
            sequences = [m["sequence"] for m in metrics if m["type"] == "PERIODICAL"]
            assert len(sequences) == len(set(sequences)) == t["intermediateCount"], (t["id"], sequences)
            if t["replica"] == victim_name and t["status"] == "FAILED":  # it died with its container: said so
                assert "keeper exited unexpectedly" in t["message"], t  # and what it reported is kept
            else:
                assert t["status"] == "SUCCEEDED" and sequences == list(range(8)), t
        lost = [t["id"] for t in trials if t["status"] == "FAILED"]
        report(
            f"killed replica: {len(lost)} trial(s) failed with it (retried once issue 22 lands), "
            f"{18 - len(lost)} succeeded; no metric lost or duplicated"
        )
    assert not project.containers(every=True), "down -v leaves no container"
    assert not project.volumes(), "down -v leaves no volume"


def experiment_named(project: ComposeProject, name: str) -> str | None:
    found = [e["id"] for e in project.rest("GET", "/experiments").json() if e["config"]["experimentName"] == name]
    return found[0] if found else None


def test_compose_v1_reads_the_same_file_and_brings_every_service_up_healthy(images, tmp_path):
    with compose_project("trialbus-test-v1", 1, images, tmp_path) as project:
        took = project.up()
        report(f"compose v1: up → every container healthy in {took:.1f}s")
        assert_started_after_a_healthy_nats(project)
        code = tmp_path / "code"
        code.mkdir()
        (code / "trial.py").write_text(SLOW_TRIAL.replace("range(8)", "range(2)").replace("0.5", "0.05"))
        (code / "config.yml").write_text(SLOW_CONFIG.replace("maxTrialNumber: 18", "maxTrialNumber: 4"))
        done = project.trialbus("experiment", "run", "-f", str(code / "config.yml"))
        assert done.returncode == 0 and "4 succeeded" in done.stdout, done.stdout + done.stderr
    assert not project.containers(every=True) and not project.volumes(), "down -v leaves nothing"


#: Run in the image: each ``python -m MODULE`` command's module is found and its package imports;
#: any other command's program is on PATH. Prints what it cannot run.
RUNNABLE = """
import importlib, importlib.util, shutil, sys
for command in sys.argv[1:]:
    argv = command.split()
    if argv[:2] == ["python", "-m"]:
        try:
            importlib.import_module(argv[2])
            ok = importlib.util.find_spec(argv[2] + ".__main__") or importlib.util.find_spec(argv[2])
        except ImportError as exc:
            ok = print(exc)
    else:
        ok = shutil.which(argv[0])
    if not ok:
        print("cannot run:", command)
"""


def test_the_kubernetes_manifests_render_with_the_built_image_and_run_commands_it_has(images, tmp_path):
    """No cluster here: kustomize renders each overlay under a release kustomization that sets
    the image the build made (as a release pipeline does), and every container of that image
    has a command the image can run."""
    tree = operator_tree(tmp_path)
    commands: set[str] = set()
    for overlay in sorted(p.name for p in (tree / "overlays").iterdir()):
        ours = {
            " ".join(cmd)
            for image, cmd in container_commands(render_with_image(tree, overlay, images.trialbus))
            if image == images.trialbus
        }
        assert ours, f"k8s/overlays/{overlay}: no container runs {images.trialbus}"
        commands |= ours
    out = engine.output_of(images.trialbus, ["python", "-c", RUNNABLE, *sorted(commands)])
    assert out == "", out
    assert len(commands) >= len(USERS), sorted(commands)
    report(f"k8s: {len(commands)} commands of {images.trialbus} run in the image")
