"""The trial side of a Trialbus-run Optuna study: :class:`RemoteTrial`, and :class:`Asker`, its line
to the study.

An objective gets a :class:`RemoteTrial` where ``study.optimize`` would give an
``optuna.trial.Trial``: the same methods objectives call, each one a question (an
:class:`~contracts.asks.Ask`) that :class:`Asker` POSTs to the metrics gateway with the trial's ask
token; the gateway relays it over NATS to the user's process, where the study's own ``Trial``
answers it (sampler, pruner and storage all live there: docs/optuna.md). Values a trial already
has (a parameter suggested before, in this attempt or, replayed from the study's storage, in an
earlier one) are answered here without asking again.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalChoiceType,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
    json_to_distribution,
)

from contracts import VERSION
from contracts.asks import Answer, Ask, AskOp

#: Seconds between two tries of an ask the gateway could not answer now (503/504, no connection).
RETRY_DELAY = 1.0
#: Seconds an ask is retried at most before the trial gives up.
ASK_DEADLINE = 600.0
#: Seconds one HTTP request may take (the gateway waits for the answer up to its own limit).
HTTP_TIMEOUT = 60.0


class AskError(RuntimeError):
    """The study refused a question, or could not be reached in :data:`ASK_DEADLINE`."""


class Asker:
    """POSTs asks for one trial attempt: ``ask(op, **fields)`` → the answer's value."""

    def __init__(
        self, gateway_url: str, token: str, experiment_id: str, trial_id: str, attempt: int = 0, owner: str = ""
    ) -> None:
        self.url = f"{gateway_url.rstrip('/')}/api/v1/trials/{trial_id}/ask"
        self.token, self.owner = token, owner
        self.experiment_id, self.trial_id, self.attempt = experiment_id, trial_id, attempt

    @classmethod
    def from_env(cls, environ: dict[str, str]) -> Asker:
        """The asker of the trial the keeper started (its environment: docs/optuna.md)."""
        missing = [
            k
            for k in ("TRIALBUS_GATEWAY_URL", "TRIALBUS_ASK_TOKEN", "NNI_EXP_ID", "NNI_TRIAL_JOB_ID")
            if not environ.get(k)
        ]
        if missing:
            raise AskError(f"not started by a Trialbus trial keeper with a gateway: {', '.join(missing)} unset")
        return cls(
            environ["TRIALBUS_GATEWAY_URL"],
            environ["TRIALBUS_ASK_TOKEN"],
            environ["NNI_EXP_ID"],
            environ["NNI_TRIAL_JOB_ID"],
            int(environ.get("TRIALBUS_ATTEMPT") or 0),
            environ.get("TRIALBUS_ASK_OWNER", ""),
        )

    def body(self, op: AskOp, **fields: Any) -> bytes:
        """The request body: an :class:`Ask` as JSON, without ``trialId`` (the URL names it)."""
        ask = Ask(
            experiment_id=self.experiment_id,
            trial_id=self.trial_id,
            owner=self.owner,
            attempt=self.attempt,
            op=op,
            **fields,
        )
        wire = json.loads(ask.encode())
        del wire["trialId"]
        return json.dumps(wire).encode()

    def ask(self, op: AskOp, **fields: Any) -> Any:
        body = self.body(op, **fields)
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
            "X-Trialbus-Keeper-Version": VERSION,
        }
        deadline = time.monotonic() + ASK_DEADLINE
        while True:
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
                    answer = Answer.decode(response.read())
                break
            except urllib.error.HTTPError as exc:
                reason = _error(exc)
                if exc.code not in (502, 503, 504):
                    raise AskError(f"{op}: the gateway refused ({exc.code}): {reason}") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = str(exc)
            if time.monotonic() > deadline:
                raise AskError(f"{op}: no answer in {ASK_DEADLINE:g}s ({reason})")
            time.sleep(RETRY_DELAY)
        if not answer.ok:
            raise AskError(f"{op}: {answer.error}")
        return answer.value


def _error(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return exc.reason


class RemoteTrial:
    """Optuna's ``Trial`` as objectives use it, answered by the study in the user's process."""

    def __init__(self, asker: Asker, number: int) -> None:
        self._asker = asker
        self.number = number
        self._params: dict[str, Any] = {}
        self._distributions: dict[str, BaseDistribution] = {}
        self._user_attrs: dict[str, Any] = {}

    def load(self) -> RemoteTrial:
        """Take what the study has of this trial (an earlier attempt's parameters and attributes)."""
        state = self._asker.ask("state")
        self.number = int(state["number"])
        self._params.update(state["params"])
        self._user_attrs.update(state["userAttrs"])
        self._distributions.update({k: json_to_distribution(v) for k, v in state["distributions"].items()})
        return self

    # -- suggestions ---------------------------------------------------------------------------------

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        return float(self._suggest(name, FloatDistribution(low, high, log=log, step=step)))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return int(self._suggest(name, IntDistribution(low, high, log=log, step=step)))

    def suggest_categorical(self, name: str, choices: Sequence[CategoricalChoiceType]) -> Any:
        return self._suggest(name, CategoricalDistribution(choices))

    def suggest_uniform(self, name: str, low: float, high: float) -> float:
        return self.suggest_float(name, low, high)

    def suggest_loguniform(self, name: str, low: float, high: float) -> float:
        return self.suggest_float(name, low, high, log=True)

    def suggest_discrete_uniform(self, name: str, low: float, high: float, q: float) -> float:
        return self.suggest_float(name, low, high, step=q)

    def _suggest(self, name: str, distribution: BaseDistribution) -> Any:
        if name in self._params and self._distributions.get(name) == distribution:
            return self._params[name]  # asked before: Optuna answers the same without the sampler
        value = self._asker.ask("suggest", name=name, distribution=distribution_to_json(distribution))
        if isinstance(distribution, CategoricalDistribution):  # JSON has no tuples: the choice itself
            value = next((c for c in distribution.choices if c == value and type(c) is type(value)), value)
        self._params[name], self._distributions[name] = value, distribution
        return value

    # -- pruning and attributes ----------------------------------------------------------------------

    def report(self, value: float, step: int) -> None:
        self._asker.ask("report", value=float(value), step=int(step))

    def should_prune(self) -> bool:
        return bool(self._asker.ask("should_prune"))

    def set_user_attr(self, key: str, value: Any) -> None:
        self._asker.ask("set_user_attr", name=key, value=value)
        self._user_attrs[key] = value

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._params)

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        return dict(self._distributions)

    @property
    def user_attrs(self) -> dict[str, Any]:
        return dict(self._user_attrs)
