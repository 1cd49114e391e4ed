"""Teams share one Trialbus: people with their own tokens, who may act only on their team's work.

A real stack (dispatcher, gateway, local adapter as processes on a real nats-server); the admin
is the stack's own token, as `trialbus up` makes it; everyone else is added by the admin over
the REST API and uses the token they were given, as a person would with curl.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import nats
import orjson
import pytest

from contracts.people import hash_token
from tests.e2e.conftest import config
from tests.e2e.helpers import ended, trial, wait_until
from tests.fixtures.stack import Stack

TRIALBUS = str(Path(sys.executable).parent / "trialbus")


def as_(stack: Stack, token: str, method: str, path: str, **kwargs) -> httpx.Response:
    return stack.rest(method, path, headers={"Authorization": f"Bearer {token}"}, **kwargs)


def add(stack: Stack, name: str, team: str, role: str = "member") -> str:
    answer = stack.rest("POST", "/users", json={"name": name, "team": team, "role": role})
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert (body["name"], body["team"], body["role"]) == (name, team, role)
    return body["token"]


def refused(answer: httpx.Response, status: int, words: str) -> None:
    assert answer.status_code == status, (answer.status_code, answer.text)
    assert words in answer.json()["error"], answer.text


@pytest.fixture
def people(stack: Stack) -> dict[str, str]:
    return {
        "ana": add(stack, "ana", "vision"),
        "bo": add(stack, "bo", "nlp"),
        "vic": add(stack, "vic", "vision", "viewer"),
    }


def test_a_member_acts_on_their_teams_work_and_gets_403_on_another_teams(stack, people, code_dir):
    # Given an experiment of team vision, made by ana, with a long trial
    made = as_(stack, people["ana"], "POST", "/experiments", json=config(code_dir))
    assert made.status_code == 201, made.text
    experiment = made.json()["id"]
    shown = stack.rest("GET", f"/experiments/{experiment}").json()
    assert (shown["owner"], shown["team"]) == ("ana", "vision")
    submitted = as_(
        stack, people["ana"], "POST", f"/experiments/{experiment}/trials", json={"parameters": {"x": 1, "sleep": 60}}
    )
    assert submitted.status_code == 201, submitted.text
    trial_id = submitted.json()["id"]
    wait_until(lambda: trial(stack, trial_id)["status"] == "RUNNING", 30, "RUNNING")
    shown = trial(stack, trial_id)
    assert (shown["owner"], shown["team"]) == ("ana", "vision")  # the trial records them too

    # When bo of team nlp tries to cancel its trial, stop it, submit to it or delete it
    # Then each is refused with why, and the trial runs on
    for method, path in (
        ("POST", f"/trials/{trial_id}/cancel"),
        ("POST", f"/trials/{trial_id}/retry"),
        ("DELETE", f"/experiments/{experiment}"),
        ("POST", f"/experiments/{experiment}/delete"),
    ):
        refused(as_(stack, people["bo"], method, path), 403, "belongs to team vision; bo (team nlp)")
    refused(
        as_(stack, people["bo"], "POST", f"/experiments/{experiment}/trials", json={"parameters": {"x": 2}}),
        403,
        "belongs to team vision",
    )
    assert trial(stack, trial_id)["status"] == "RUNNING"
    # (everyone reads: bo sees it)
    assert as_(stack, people["bo"], "GET", f"/trials/{trial_id}").status_code == 200

    # And a viewer of vision reads but changes nothing
    assert as_(stack, people["vic"], "GET", f"/experiments/{experiment}").status_code == 200
    refused(as_(stack, people["vic"], "POST", f"/trials/{trial_id}/cancel"), 403, "vic is a viewer")
    refused(as_(stack, people["vic"], "POST", "/experiments", json=config(code_dir)), 403, "vic is a viewer")

    # And ana cancels her own trial
    assert as_(stack, people["ana"], "POST", f"/trials/{trial_id}/cancel").status_code == 202
    assert ended(stack, trial_id)["status"] == "USER_CANCELED"

    # And the audit trail says who did what, refusals too, newest last
    trail = stack.rest("GET", "/audit", params={"team": "vision"}).json()
    said = [(r["user"], r["action"], r["status"]) for r in trail]
    assert said[0] == ("ana", "experiment.create", 200)
    assert ("bo", "trial.cancel", 403) in said and ("ana", "trial.cancel", 200) in said
    assert said[-1] == ("ana", "trial.cancel", 200)
    refusal = next(r for r in trail if r["user"] == "bo" and r["action"] == "trial.cancel")
    assert (
        refusal["target"] == trial_id and refusal["team"] == "vision" and "belongs to team vision" in refusal["message"]
    )
    # a member reads only their own team's trail
    assert {r["team"] for r in as_(stack, people["bo"], "GET", "/audit").json()} <= {"nlp"}
    refused(as_(stack, people["bo"], "GET", "/audit", params={"team": "vision"}), 403, "only their team's")


def test_submits_are_audited_together_with_their_count(stack, people, code_dir):
    made = as_(stack, people["ana"], "POST", "/experiments", json=config(code_dir))
    experiment = made.json()["id"]
    for i in range(5):
        body = {"parameters": {"x": i}}
        submitted = as_(stack, people["ana"], "POST", f"/experiments/{experiment}/trials", json=body)
        assert submitted.status_code == 201, submitted.text
    refused(
        as_(stack, people["bo"], "POST", f"/experiments/{experiment}/trials", json={"parameters": {"x": 9}}),
        403,
        "belongs to team vision",
    )

    def submits() -> list[dict]:
        trail = stack.rest("GET", "/audit", params={"experiment": experiment}).json()
        return [r for r in trail if r["action"] == "trial.submit"]

    # one record for ana's five (within a second or two), the refusal on its own
    found = wait_until(lambda: sum(r["count"] for r in submits() if r["user"] == "ana") == 5 and submits(), 10, "5")
    assert len([r for r in found if r["user"] == "ana"]) <= 2, found  # (five submits may straddle a second)
    assert [(r["user"], r["status"], r["count"]) for r in found if r["user"] == "bo"] == [("bo", 403, 1)]


def test_an_admin_adds_lists_rotates_and_removes_users_and_only_an_admin_may(stack, people):
    # whoami names the person behind each token
    assert as_(stack, people["bo"], "GET", "/whoami").json() == {"name": "bo", "team": "nlp", "role": "member"}
    assert stack.rest("GET", "/whoami").json()["role"] == "admin"
    listed = stack.rest("GET", "/users").json()
    assert [(u["name"], u["team"], u["role"]) for u in listed] == [
        ("ana", "vision", "member"),
        ("bo", "nlp", "member"),
        ("vic", "vision", "viewer"),
    ]
    assert all("token" not in u and "tokenHash" not in u for u in listed)

    # members and viewers may not manage users
    refused(as_(stack, people["ana"], "GET", "/users"), 403, "only an admin may manage users")
    refused(as_(stack, people["ana"], "POST", "/users", json={"name": "eve", "team": "vision"}), 403, "only an admin")

    # bad input is refused with what to send, and changes nothing
    refused(stack.rest("POST", "/users", json={"name": "Eve!", "team": "x"}), 422, "is not a valid name")
    refused(stack.rest("POST", "/users", json={"name": "eve", "team": "x", "role": "root"}), 422, "role must be one of")
    refused(stack.rest("POST", "/users", json={"name": "ana", "team": "nlp"}), 409, "user ana exists")
    refused(stack.rest("POST", "/users", json={"name": "eve", "team": "x", "extra": 1}), 422, "unknown field(s) extra")
    assert len(stack.rest("GET", "/users").json()) == 3

    # a rotated token replaces the old one at once
    rotated = stack.rest("POST", "/users/bo/token")
    assert rotated.status_code == 200
    refused(as_(stack, people["bo"], "GET", "/whoami"), 401, "wrong bearer token")
    assert as_(stack, rotated.json()["token"], "GET", "/whoami").json()["name"] == "bo"

    # a removed user's token stops working
    assert stack.rest("DELETE", "/users/vic").status_code == 200
    refused(as_(stack, people["vic"], "GET", "/experiments"), 401, "wrong bearer token")
    refused(stack.rest("DELETE", "/users/vic"), 404, "no user 'vic'")

    # and users outlive a restart of the dispatcher
    stack.restart("dispatcher")
    assert as_(stack, people["ana"], "GET", "/whoami").json()["team"] == "vision"


def test_tokens_are_kept_only_as_hashes(stack, people, tmp_path):
    # Given the users' records written (the dispatcher's bucket, in nats-server's store) and the logs
    stack.stop()
    # Then a grep for each token over the store, the data dir and every log finds nothing
    for token in people.values():
        found = subprocess.run(
            ["grep", "-rl", "--binary-files=text", token, str(tmp_path), str(stack.nats.store)],
            capture_output=True,
            text=True,
        )
        assert found.returncode == 1 and found.stdout == "", f"a token in clear in {found.stdout}"
    # (and its hash is there: the grep does look at the store)
    digest = hash_token(people["ana"])
    assert subprocess.run(["grep", "-rlq", "--binary-files=text", digest, str(stack.nats.store)]).returncode == 0


async def test_the_nats_api_knows_who_asks_by_the_token_header(stack, people, code_dir):
    # As the CLI and the Python client send it: Authorization in the request's headers
    nc = await nats.connect(stack.nats.url)
    try:

        async def ask(op: str, body: dict, token: str | None) -> dict:
            headers = {"Authorization": f"Bearer {token}"} if token else None
            reply = await nc.request(f"trialbus.api.{op}", orjson.dumps(body), timeout=10, headers=headers)
            return orjson.loads(reply.data)

        assert (await ask("whoami", {}, people["bo"]))["result"]["name"] == "bo"
        made = await ask("experiment.create", {"config": config(code_dir)}, people["ana"])
        assert made["ok"], made
        refusal = await ask("experiment.stop", {"id": made["result"]["id"]}, people["bo"])
        assert refusal == {"ok": False, "status": 403, "error": refusal["error"]}
        assert "belongs to team vision" in refusal["error"]
        wrong = await ask("whoami", {}, "not-a-token-of-anyone")
        assert wrong["status"] == 401
        viewer = await ask("experiment.create", {"config": config(code_dir)}, people["vic"])
        assert viewer["status"] == 403 and "vic is a viewer" in viewer["error"]
    finally:
        await nc.close()


def test_the_cli_adds_people_and_each_acts_as_the_token_in_their_environment(stack, tmp_path):
    def cli(token: str, *args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
        env |= {"TRIALBUS_NATS_URL": stack.nats.url, "TRIALBUS_API_TOKEN": token, "COLUMNS": "200"}
        return subprocess.run([TRIALBUS, *args], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)

    # The admin (the stack's token) adds a member; the token is printed once
    added = cli(stack.token, "user", "add", "ana", "--team", "vision")
    assert added.returncode == 0, added.stderr
    assert "added ana (team vision, member)" in added.stdout and "shown this once" in added.stdout
    token = next(line for line in added.stdout.splitlines() if line.startswith("tbu_"))

    # The member is who their token says, and may not manage users
    me = cli(token, "whoami")
    assert me.returncode == 0 and me.stdout.strip() == "ana (team vision, member)", me
    listed = cli(token, "user", "list")
    assert listed.returncode == 1 and "ana is a member: only an admin may manage users" in listed.stderr + listed.stdout
    adding = cli(token, "user", "add", "bo", "--team", "nlp")
    assert adding.returncode == 1 and "only an admin may manage users" in adding.stderr + adding.stdout

    # The admin's list and the audit trail show it
    table = cli(stack.token, "user", "list")
    assert table.returncode == 0 and "ana" in table.stdout and "vision" in table.stdout
    trail = cli(stack.token, "audit")
    lines = [line.split() for line in trail.stdout.splitlines()[1:]]
    assert trail.returncode == 0 and [line[1:5] for line in lines] == [
        ["admin", "user.add", "ana", "ok"],
        ["ana", "user.add", "bo", "403"],
    ], trail.stdout

    # A wrong token says so
    wrong = cli("tbu_not-a-token-of-anyone", "whoami")
    assert wrong.returncode == 1 and "wrong API token" in wrong.stderr + wrong.stdout
