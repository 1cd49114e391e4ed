"""``POST /api/v1/trials/{trialId}/ask``: a trial's question to its tuner, relayed over NATS.

A trial has no NATS access (docs/architecture.md, Security); a define-by-run objective's
``trial.suggest_*`` asks the sampler in the user's process through here (docs/optuna.md).
Checks as for metrics, cheapest first:

    version header (400/409) → bearer ask token present (401: ``TRIALBUS_ASK_TOKEN``, not the
    keeper's) → body size (413, ``gateway_max_ask_body``)
    → body JSON and shape (400) → token HMAC (401) → NATS connected (503)
    → request on ``asks.<owner>.<experiment>.<trial>`` (503 nobody answers, 504 no answer in time)
    → 200 with the answer (:class:`contracts.asks.Answer`) as it came

The subject names the experiment, trial and owner the token is for (the owner is bound into the
ask token: :func:`services.common.tokens.ask_token`), so a trial asks only as itself, and only
its experiment's owner (or the ``client`` user) may answer; the answer is checked to be an
Answer before it is handed back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from prometheus_client import Counter
from pydantic import ValidationError

from contracts import subjects
from contracts.asks import Answer, Ask
from contracts.base import ContractError
from contracts.people import NAME
from services.common import logs, tokens
from services.common.bus import Bus
from services.metrics_gateway.app import NOT_IN_SUBJECTS, REJECTIONS, Refused, bearer, check_version
from services.metrics_gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

ASK_PATH = "/api/v1/trials/{trial_id}/ask"
ASKS = Counter("trialbus_gateway_asks", "Trials' questions relayed, by outcome", ["outcome"])


class AskRelay:
    """The ask route's logic (module docstring)."""

    def __init__(self, settings: GatewaySettings, bus: Callable[[], Bus | None]) -> None:
        self.settings = settings
        self.bus = bus

    async def relay(self, trial_id: str, version: str | None, authorization: str | None, body: bytes) -> bytes:
        """The answer's JSON; raises Refused otherwise."""
        experiment_id = None
        try:
            check_version(version)
            token = bearer(authorization)
            limit = self.settings.gateway_max_ask_body
            if len(body) > limit:
                raise Refused(413, "too_large", f"an ask is over the limit of {limit} bytes")
            try:
                raw = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise Refused(400, "bad_request", f"request body is not JSON: {exc}") from None
            if not isinstance(raw, dict):
                raise Refused(400, "bad_request", "request body must be a JSON object (an ask)")
            experiment_id = raw.get("experimentId")
            if not isinstance(experiment_id, str) or not experiment_id or NOT_IN_SUBJECTS.intersection(experiment_id):
                raise Refused(400, "bad_request", "experimentId must be a non-empty id without '.', '*', '>' or spaces")
            secret = self.settings.trial_secret.get_secret_value()
            owner = raw.get("owner", "")
            if not isinstance(owner, str) or (owner and not NAME.match(owner)):
                raise Refused(400, "bad_request", "owner must be a person's name, or empty")
            mine = tokens.check_ask_token(secret, experiment_id, trial_id, owner, token)
            if NOT_IN_SUBJECTS.intersection(trial_id) or not mine:
                raise Refused(401, "token", f"wrong token for trial {trial_id} of experiment {experiment_id}")
            try:
                ask = Ask.model_validate({**raw, "trialId": trial_id})
            except ValidationError as exc:
                raise Refused(400, "bad_request", f"not an ask: {exc.errors(include_url=False)[:3]}") from None
            answer = await self._request(ask)
        except Refused as exc:
            REJECTIONS.labels(exc.reason).inc()
            ASKS.labels("refused").inc()
            with logs.bind(experiment=experiment_id, trial=trial_id):
                log.warning("refused an ask with %d: %s", exc.status, exc.message)
            raise
        ASKS.labels("answered").inc()
        return answer

    async def _request(self, ask: Ask) -> bytes:
        bus = self.bus()
        if bus is None or not bus.nc.is_connected:
            raise Refused(503, "unavailable", "NATS is unavailable; retry later")
        subject = subjects.asks(ask.owner, ask.experiment_id, ask.trial_id)
        try:
            msg = await bus.nc.request(subject, ask.encode(), timeout=self.settings.gateway_ask_timeout)
        except NoRespondersError:
            raise Refused(503, "unavailable", "nobody answers this experiment's questions now; retry later") from None
        except TimeoutError:
            raise Refused(504, "unavailable", "the experiment's tuner did not answer in time; retry later") from None
        except (NatsError, OSError) as exc:
            raise Refused(503, "unavailable", f"NATS did not take the ask ({exc}); retry later") from None
        try:
            Answer.decode(msg.data)
        except ContractError as exc:
            raise Refused(502, "bad_answer", f"the tuner's answer is not an answer: {exc}") from None
        return msg.data
