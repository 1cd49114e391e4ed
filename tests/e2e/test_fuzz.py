"""Every HTTP endpoint of the dispatcher, the gateway and the web UI, fuzzed from its OpenAPI schema
(schemathesis) against the real services: no 5xx, no hang, an honest schema, and a refusal never
changes what a user sees; without the token, only refusals.

The suite runs a small budget with a fixed seed (Hypothesis ``derandomize``); ``make fuzz`` runs
the same tests longer: ``FUZZ_EXAMPLES`` cases per operation and generation mode (positive,
negative), ``FUZZ_SEED`` to replay a run, and prints what was called and answered.

The stack has no adapter and no tuner on purpose: experiments the fuzzer creates never run a
command, and their trials wait (the trials' logs are then 503, which the schema declares).
Two more tests send what a schema cannot describe (JSON nested past any recursion limit, lone
surrogates, NaN, durations no deadline can be computed with, unreadable code directories).
"""

from __future__ import annotations

import io
import json
import os
import random
import tarfile
import time
from dataclasses import dataclass

import httpx
import pytest
import schemathesis
from hypothesis import strategies as st

from contracts import VERSION
from services.common import tokens
from services.metrics_gateway.app import create_app as gateway_app
from services.metrics_gateway.settings import GatewaySettings
from services.webui.app import load_static
from tests.fixtures.fuzz import Fuzzer, StateProbe, Target, differences
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack

#: Cases per operation and generation mode; the suite's budget, ``make fuzz`` sets more.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "4"))


def _seed(given: str) -> int | None:
    """``FUZZ_SEED``: a number replays a run, ``random`` draws one (the summary prints it), unset is the
    suite's fixed, derandomized run."""
    if not given:
        return None
    return random.randrange(2**32) if given == "random" else int(given)


SEED = _seed(os.environ.get("FUZZ_SEED", ""))
STATIC_FILES = sorted(load_static())


def _archive() -> bytes:
    """A tar.gz of a code directory holding ``trial.py``, as ``trialbus`` uploads it."""
    content, packed = b"print('hello')\n", io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        member = tarfile.TarInfo("trial.py")
        member.size = len(content)
        tar.addfile(member, io.BytesIO(content))
    return packed.getvalue()


ARCHIVE = _archive()
CONFIG = {
    "experimentName": "fuzz",
    "trialCommand": "python3 trial.py",
    "trialConcurrency": 1,
    "trainingService": {"platform": "local"},
}


@dataclass
class Known:
    """Real experiments and trials, for cases to aim at: ``trials`` maps each trial to its experiment."""

    experiments: list[str]
    trials: dict[str, str]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    nats_server = NatsServer(tmp_path_factory.mktemp("fuzz-jetstream")).start()
    # The services' working directory holds only their logs: a fuzzed trialCodeDirectory "." packs it.
    stack = Stack(root=tmp_path_factory.mktemp("fuzz-stack"), nats=nats_server)
    try:
        yield stack.start("dispatcher", "gateway", "webui")
    finally:
        stack.stop()
        nats_server.stop()


@pytest.fixture(scope="module")
def fuzzer(stack, request):
    probe = StateProbe(stack.nats.url, stack.api, stack.auth)
    fuzzer = Fuzzer(probe, examples=EXAMPLES, seed=SEED)
    yield fuzzer
    probe.close()
    fuzzer.session.close()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if "FUZZ_EXAMPLES" in os.environ and reporter is not None:  # make fuzz: what was called and answered
        with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
            reporter.write_line("\n" + fuzzer.summary())


@pytest.fixture
def known(stack) -> Known:
    """A running experiment with a dispatched trial (with a metric) and a waiting one, and a stopped one."""
    running = stack.rest("POST", "/experiments", json=CONFIG).json()["id"]
    trials = [
        stack.rest("POST", f"/experiments/{running}/trials", json={"parameters": {"x": x}}).json()["id"] for x in (1, 2)
    ]
    record = {"trial_job_id": trials[0], "type": "PERIODICAL", "sequence": 0, "value": "0.5"}
    reply = httpx.post(
        f"{stack.gateway}/api/v1/trials/{trials[0]}/metrics",
        json={"experimentId": running, "records": [record]},
        headers={
            "Authorization": f"Bearer {tokens.trial_token(stack.secret, running, trials[0])}",
            "X-Trialbus-Keeper-Version": VERSION,
        },
    )
    assert reply.status_code == 200, reply.text
    stopped = stack.rest("POST", "/experiments", json=CONFIG).json()["id"]
    assert stack.rest("DELETE", f"/experiments/{stopped}").status_code == 200
    return Known([running, stopped], dict.fromkeys(trials, running))


def aim_at(known: Known):
    """Some cases name a real experiment, trial or static file instead of a generated one; some code
    uploads are a real archive, some configs the fields of a valid one plus what was generated."""

    def aim(case: schemathesis.Case, data: st.DataObject) -> None:
        choices = {"experiment_id": known.experiments, "trial_id": list(known.trials), "name": STATIC_FILES}
        for name, real in choices.items():
            if name in (case.path_parameters or {}) and data.draw(st.booleans(), label=f"real {name}"):
                case.path_parameters[name] = data.draw(st.sampled_from(real), label=name)
        if case.operation.label == "POST /api/v1/code" and data.draw(st.booleans(), label="a real archive"):
            case.body = ARCHIVE
        if (
            case.operation.label == "POST /api/v1/experiments"
            and isinstance(case.body, dict)
            and data.draw(st.booleans(), label="over a valid config")
        ):
            case.body = {**CONFIG, **case.body}

    return aim


def gateway_aim(known: Known):
    """As a trial keeper sends: this release's version, often a real trial and records naming it."""

    def aim(case: schemathesis.Case, data: st.DataObject) -> None:
        case.headers["X-Trialbus-Keeper-Version"] = VERSION  # others: the anonymous run (409 before the token)
        if data.draw(st.booleans(), label="a real trial"):
            case.path_parameters["trial_id"] = data.draw(st.sampled_from(list(known.trials)), label="trial")
            if isinstance(case.body, dict):
                case.body["experimentId"] = known.trials[case.path_parameters["trial_id"]]
        records = case.body.get("records") if isinstance(case.body, dict) else None
        if isinstance(records, list) and data.draw(st.booleans(), label="records name the trial"):
            for record in records:
                if isinstance(record, dict):
                    record["trial_job_id"] = case.path_parameters["trial_id"]

    return aim


def trial_token(stack: Stack):
    """The token of the case's trial (as the dispatcher gives each trial), where its ids allow one."""

    def headers(case: schemathesis.Case) -> dict[str, str]:
        experiment = case.body.get("experimentId") if isinstance(case.body, dict) else None
        trial = case.path_parameters.get("trial_id")
        if not isinstance(experiment, str) or not isinstance(trial, str):
            return {}
        return {"Authorization": f"Bearer {tokens.trial_token(stack.secret, experiment, trial)}"}

    return headers


@pytest.fixture
def targets(stack, known) -> dict[str, Target]:
    dispatcher = f"http://127.0.0.1:{stack.api_port}"
    gateway = gateway_app(GatewaySettings(trial_secret=stack.secret), bus=lambda: None, publish=None)
    return {
        "dispatcher": Target(
            "dispatcher",
            schemathesis.openapi.from_url(f"{dispatcher}/api/openapi.json"),
            dispatcher,
            lambda case: stack.auth,
            aim_at(known),
        ),
        "webui": Target(
            "webui",
            schemathesis.openapi.from_url(f"{stack.webui}/api/openapi.json"),
            stack.webui,
            lambda case: stack.auth,
            aim_at(known),
        ),
        "gateway": Target(
            "gateway",
            schemathesis.openapi.from_dict(gateway.openapi()),
            stack.gateway,
            trial_token(stack),
            gateway_aim(known),
            anonymous=(400, 401, 409),
        ),
    }


def errors_logged(stack: Stack, since: dict[str, int]) -> list[str]:
    """Errors the services logged since ``since`` (each log's length then): an error a caller never
    saw is a bug too (an experiment the dispatcher accepted but cannot sweep, a crashed stream)."""
    return [
        f"{name} logged: {line}"
        for name, start in since.items()
        for line in stack.log(name)[start:].splitlines()
        if " ERROR " in line or line.startswith("Traceback")
    ]


@pytest.mark.parametrize("who", ["authorised", "anonymous"])
@pytest.mark.parametrize("service", ["dispatcher", "gateway", "webui"])
def test_every_endpoint_survives_fuzzing(service, who, stack, targets, fuzzer):
    since = {name: len(stack.log(name)) for name in ("dispatcher", "gateway", "webui")}
    changes = fuzzer.changes
    failures = fuzzer.run(targets[service], who)
    if fuzzer.changes > changes:
        time.sleep(1.2)  # what was accepted has been through the dispatcher's sweep (once a second)
    failures += errors_logged(stack, since)
    assert not failures, f"{len(failures)} failure(s):\n\n" + "\n\n".join(failures)


def test_what_no_schema_can_describe_is_refused_cleanly(stack, known, fuzzer):
    """JSON a schema cannot express (nesting past any recursion limit, lone surrogates, NaN) and values
    at the edges of what the services compute with: a 4xx each, nothing changed, nothing logged."""
    since = {name: len(stack.log(name)) for name in ("dispatcher", "gateway", "webui")}
    running, trial = known.experiments[0], next(iter(known.trials))
    config = json.dumps(CONFIG)[1:-1].encode()  # its fields, to put more after
    openpai = {
        "platform": "openpai",
        "host": "pai",
        "username": "u",
        "token": "t",
        "trialCpuNumber": 1,
        "storageConfigName": "s",
        "localStorageMountPoint": "/l",
        "containerStorageMountPoint": "/c",
        "trialMemorySize": "9" * 400 + "gb",
    }
    cases = [
        ("/experiments", b"[" * 100_000 + b"]" * 100_000, 400),
        ("/experiments", b'{"a":' * 5_000 + b"1" + b"}" * 5_000, 400),
        ("/experiments", b"{" + config + b', "experimentName": "\\ud800"}', 400),
        (f"/experiments/{running}/trials", b'{"parameters": {"x": NaN}}', 400),
        (f"/experiments/{running}/trials", b'{"parameters": {"\\ud800": 1}}', 400),
        (f"/experiments/{running}/trials", b'{"parameters": {}, "parameterId": "\\udfff"}', 400),
        # durations past what a deadline can be computed with, or not durations at all
        ("/experiments", b"{" + config + b', "maxExperimentDuration": 1e14}', 422),
        ("/experiments", b"{" + config + b', "maxTrialDuration": 1' + b"0" * 40 + b"}", 422),
        ("/experiments", b"{" + config + b', "maxExperimentDuration": []}', 422),
        ("/experiments", b"{" + config + b', "maxTrialDuration": {"h": 1}}', 422),
        ("/experiments", json.dumps({**CONFIG, "trialGpuNumber": 0, "trainingService": openpai}).encode(), 422),
    ]
    before = fuzzer.probe.read()
    answers = [
        (path, stack.rest("POST", path, content=body, headers={"Content-Type": "application/json"}))
        for path, body, _ in cases
    ]
    deep = json.dumps({"trial_job_id": trial, "type": "FINAL", "sequence": 0, "value": 1})
    for record in (
        deep.replace('"value": 1', '"value": ' + "[" * 100_000 + "]" * 100_000),
        deep.replace('"sequence": 0', '"sequence": 0, "parameter_id": "\\ud800"'),
    ):
        answers.append(
            (
                "gateway",
                httpx.post(
                    f"{stack.gateway}/api/v1/trials/{trial}/metrics",
                    json={"experimentId": running, "records": [record]},
                    headers={
                        "Authorization": f"Bearer {tokens.trial_token(stack.secret, running, trial)}",
                        "X-Trialbus-Keeper-Version": VERSION,
                    },
                    timeout=10,
                ),
            )
        )
    expected = [status for _, _, status in cases] + [400, 400]
    assert [(path, answer.status_code) for path, answer in answers] == [
        (path, status) for (path, _), status in zip(answers, expected, strict=True)
    ], [answer.text[:200] for _, answer in answers]
    assert all("error" in answer.json() for _, answer in answers)
    time.sleep(1.2)  # a config the dispatcher could not sweep would show within a second
    assert differences(before, fuzzer.probe.read()) == []
    assert errors_logged(stack, since) == []


def test_an_unreadable_code_directory_is_a_refusal(stack):
    """Files that are not the size they say (``/sys``) or cannot be opened: 422 naming one, never a 500."""
    reply = stack.rest("POST", "/experiments", json={**CONFIG, "trialCodeDirectory": "/sys/kernel"})
    assert reply.status_code in (201, 422), reply.text  # 201 where this host's /sys/kernel reads back whole
    if reply.status_code == 422:
        assert "cannot read /sys/kernel/" in reply.json()["error"]
