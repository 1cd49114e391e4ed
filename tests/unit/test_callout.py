"""The auth callout's answers, as nats-server reads them (tests/integration/test_nats_people.py
runs it against the real server): a user JWT for a person's token, an error for anything else,
nothing for a request the server did not sign."""

from __future__ import annotations

import secrets

import nkeys
import pytest

from contracts.people import Caller, new_token, token_key, token_name
from services.dispatcher.callout import ACCOUNT, REQUEST_AUDIENCE, Callout, decode, encode, new_issuer

ANA = Caller("ana", "vision", "member")


def key(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(nkeys.encode_seed(secrets.token_bytes(32), prefix))


SERVER, USER = key(nkeys.PREFIX_BYTE_SERVER), key(nkeys.PREFIX_BYTE_USER)


@pytest.fixture
def callout() -> tuple[Callout, str]:
    seed, _ = new_issuer()
    token = new_token("ana")
    return Callout(None, seed, {token: ANA}.get), token  # type: ignore[arg-type]  # no connection needed


def request(connect: dict, signer: nkeys.KeyPair = SERVER) -> bytes:
    """An authorization request as nats-server makes it (server/auth_callout.go)."""
    server = SERVER.public_key.decode()
    claims = {
        "aud": REQUEST_AUDIENCE,
        "sub": "ISSUER",
        "nats": {
            "server_id": {"name": "n", "host": "127.0.0.1", "id": server, "version": "2.15.1"},
            "user_nkey": USER.public_key.decode(),
            "client_info": {"host": "127.0.0.1", "id": 7, "kind": "Client", "type": "nats"},
            "connect_opts": {"lang": "python3", "version": "2.16.0", "protocol": 1, **connect},
            "type": "authorization_request",
            "version": 2,
        },
    }
    return encode(claims, signer).encode()


def response(callout: Callout, connect: dict) -> dict:
    answer = callout.answer(request(connect))
    assert answer is not None
    claims = decode(answer.decode(), nkeys.PREFIX_BYTE_ACCOUNT)
    assert claims["iss"] == callout.issuer
    assert (claims["aud"], claims["sub"]) == (SERVER.public_key.decode(), USER.public_key.decode())
    assert claims["nats"]["type"] == "authorization_response" and claims["nats"]["version"] == 2
    return claims["nats"]


def test_a_person_s_token_gets_a_user_jwt_with_their_permissions(callout):
    callout, token = callout
    for connect in ({"auth_token": token}, {"user": "ana", "pass": token}):
        answer = response(callout, connect)
        assert "error" not in answer
        user = decode(answer["jwt"], nkeys.PREFIX_BYTE_ACCOUNT)
        assert (user["iss"], user["sub"], user["aud"], user["name"]) == (
            callout.issuer,
            USER.public_key.decode(),
            ACCOUNT,
            "ana",
        )
        nats = user["nats"]
        assert nats["type"] == "user" and nats["version"] == 2
        assert nats["sub"] == {"allow": ["_INBOX_as.ana.>", "asks.ana.*.*"]}  # her inbox, her trials' questions
        assert nats["resp"] == {"max": 1, "ttl": 0}
        assert nats["pub"]["allow"][0] == f"trialbus.as.ana.{token_key(token)}.>"  # the door of this token
        assert not any(
            s.startswith(("trialbus.api", "_INBOX", "events", "dispatch", "$KV")) for s in nats["pub"]["allow"]
        )


@pytest.mark.parametrize(
    "connect",
    [
        {},  # no credential
        {"auth_token": "tbu_ana.wrong"},
        {"auth_token": "the-stack-s-own-token-is-no-person-s"},
        {"user": "bo", "pass": "TOKEN"},  # the right token under another name
    ],
)
def test_anything_but_a_person_s_token_gets_an_error(callout, connect):
    callout, token = callout
    connect = {k: token if v == "TOKEN" else v for k, v in connect.items()}
    answer = response(callout, connect)
    assert "jwt" not in answer and "token is needed" in answer["error"]


def test_a_request_the_server_did_not_sign_is_not_answered(callout):
    callout, token = callout
    good = request({"auth_token": token}).decode()
    header, body, _ = good.split(".")
    forged = encode({"aud": REQUEST_AUDIENCE}, key(nkeys.PREFIX_BYTE_SERVER)).split(".")[2]
    assert callout.answer(f"{header}.{body}.{forged}".encode()) is None
    assert callout.answer(b"not a jwt") is None
    # signed, but by an account key rather than a server's
    assert callout.answer(request({"auth_token": token}, key(nkeys.PREFIX_BYTE_ACCOUNT))) is None


def test_a_token_names_its_user():
    token = new_token("ana")
    assert token.startswith("tbu_ana.") and len(token) == len("tbu_ana.") + 43
    assert token_name(token) == "ana"
    assert token_name("tbu_" + secrets.token_urlsafe(32)) is None  # made before names were in tokens
    assert token_name("tbu_not-a-token-of-anyone") is None
    assert token_name("tbu_Ana.x") is None and token_name("tbu_ana.") is None and token_name(None) is None
    assert token_name("a-stack-token") is None
