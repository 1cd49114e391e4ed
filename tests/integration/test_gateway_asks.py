"""A trial's questions through the metrics gateway (``POST /api/v1/trials/{id}/ask``, docs/optuna.md):
real HTTP, a real nats-server, a real Optuna study answering a :class:`RemoteTrial`."""

from __future__ import annotations

import asyncio

import optuna
import pytest

import trialbus
from contracts import subjects
from contracts.asks import Answer, Ask
from services.common.tokens import ask_token, trial_token
from tests.integration.test_gateway import EXP, SECRET, TRIAL, gateway  # noqa: F401 - the gateway fixture
from trialbus.optuna.optimize import _Optimization
from trialbus.optuna.remote import Asker, AskError, RemoteTrial

ASK_TOKEN = ask_token(trial_token(SECRET, EXP, TRIAL), None)


def headers(token: str = ASK_TOKEN) -> dict:
    return {"Authorization": f"Bearer {token}", "X-Trialbus-Keeper-Version": trialbus.__version__}


async def answering(gateway, answer):  # noqa: F811
    """Answer asks.<EXP>.* with ``answer(Ask) -> Answer``; what was asked."""
    asked: list[Ask] = []

    async def handle(msg):
        ask = Ask.decode(msg.data)
        asked.append(ask)
        await msg.respond((await answer(ask)).encode())

    await gateway.reader.subscribe(subjects.asks(None, EXP, "*"), cb=handle)
    return asked


async def test_an_ask_is_relayed_as_the_trial_its_token_names_and_answered(gateway):  # noqa: F811
    async def answer(ask: Ask) -> Answer:
        return Answer(ok=True, value={"echo": ask.name})

    asked = await answering(gateway, answer)
    body = {"experimentId": EXP, "attempt": 2, "op": "suggest", "name": "x", "trialId": "someone-else"}
    response = await gateway.http.post(f"/api/v1/trials/{TRIAL}/ask", json=body, headers=headers())
    assert response.status_code == 200, response.text
    assert Answer.decode(response.content).value == {"echo": "x"}
    assert [(a.trial_id, a.attempt, a.op) for a in asked] == [
        (TRIAL, 2, "suggest")
    ]  # the URL's trial, never the body's


async def test_asks_are_refused_without_the_trials_ask_token_or_a_valid_body(gateway):  # noqa: F811
    url, body = f"/api/v1/trials/{TRIAL}/ask", {"experimentId": EXP, "op": "should_prune"}
    keeper = trial_token(SECRET, EXP, TRIAL)  # the keeper's metrics token is not an ask token
    assert (await gateway.http.post(url, json=body, headers=headers(keeper))).status_code == 401
    other = ask_token(trial_token(SECRET, EXP, "other"), None)
    assert (await gateway.http.post(url, json=body, headers=headers(other))).status_code == 401
    metrics = f"/api/v1/trials/{TRIAL}/metrics"  # nor is the ask token a metrics token
    assert (
        await gateway.http.post(metrics, json={"experimentId": EXP, "records": []}, headers=headers())
    ).status_code == 401
    # the owner is bound into the ask token: a trial cannot send its questions to someone else
    mallory = {**body, "owner": "mallory"}
    assert (await gateway.http.post(url, json=mallory, headers=headers())).status_code == 401
    bad = {"experimentId": EXP, "op": "rm -rf"}
    assert (await gateway.http.post(url, json=bad, headers=headers())).status_code == 400
    huge = {"experimentId": EXP, "op": "set_user_attr", "name": "n", "value": "x" * 100_000}
    assert (await gateway.http.post(url, json=huge, headers=headers())).status_code == 413
    # nobody answers this experiment's questions: 503, which the trial retries
    assert (await gateway.http.post(url, json=body, headers=headers())).status_code == 503


async def test_a_remote_trial_asks_the_study_and_a_retry_replays_its_suggestions(gateway):  # noqa: F811
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1), pruner=optuna.pruners.NopPruner())
    run = _Optimization(study, {}, 1, None, 1, (), [], client=None)
    run.trials[TRIAL] = study.ask()
    await answering(gateway, run.answer)
    url = str(gateway.http.base_url)

    def objective(attempt: int) -> tuple:
        trial = RemoteTrial(Asker(url, ASK_TOKEN, EXP, TRIAL, attempt), number=-1).load()
        kind = trial.suggest_categorical("kind", ["a", "b"])
        x = trial.suggest_float("x", -10, 10)
        n = trial.suggest_int("n", 1, 5, log=True)
        trial.report(x * x, 0)
        trial.set_user_attr("note", {"attempt": attempt})
        return trial.number, kind, x, n, trial.should_prune(), trial.params, trial.user_attrs

    first = await asyncio.to_thread(objective, 0)
    again = await asyncio.to_thread(objective, 1)
    number, kind, x, n, prune, params, attrs = first
    assert number == 0 and prune is False and kind in ("a", "b") and -10 <= x <= 10 and 1 <= n <= 5
    assert params == {"kind": kind, "x": x, "n": n} and attrs == {"note": {"attempt": 0}}
    assert again[:4] == first[:4], "a retried attempt gets the values the study stored"
    frozen = study._storage.get_trial(run.trials[TRIAL]._trial_id)
    assert frozen.params == params and frozen.intermediate_values == {0: x * x}
    assert frozen.user_attrs == {"note": {"attempt": 1}}


async def test_the_study_refusing_a_question_raises_in_the_trial(gateway):  # noqa: F811
    study = optuna.create_study()
    run = _Optimization(study, {}, 1, None, 1, (), [], client=None)
    run.trials[TRIAL] = study.ask()
    await answering(gateway, run.answer)
    trial = RemoteTrial(Asker(str(gateway.http.base_url), ASK_TOKEN, EXP, TRIAL), 0)
    await asyncio.to_thread(trial.suggest_float, "x", 0, 1)
    with pytest.raises(AskError, match="Cannot set different distribution kind"):
        await asyncio.to_thread(trial.suggest_categorical, "x", ["a"])


async def test_an_owned_experiments_asks_go_to_its_owner(gateway):  # noqa: F811
    asked: list[Ask] = []

    async def handle(msg):
        asked.append(Ask.decode(msg.data))
        await msg.respond(Answer(ok=True, value=True).encode())

    await gateway.reader.subscribe(subjects.asks("ann", EXP, TRIAL), cb=handle)
    token = ask_token(trial_token(SECRET, EXP, TRIAL), "ann")
    body = {"experimentId": EXP, "owner": "ann", "op": "should_prune"}
    response = await gateway.http.post(f"/api/v1/trials/{TRIAL}/ask", json=body, headers=headers(token))
    assert response.status_code == 200, response.text
    assert [(a.owner, a.op) for a in asked] == [("ann", "should_prune")]
