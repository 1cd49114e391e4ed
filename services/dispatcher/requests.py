"""The request an adapter receives for one attempt of a trial (``dispatch.<adapter>``)."""

from __future__ import annotations

import json

from pydantic import SecretStr

from contracts.experiment import WarmStart
from contracts.messages import TrialRequest
from contracts.state import ExperimentState, TrialState
from services.common.tokens import trial_token


def trial_request(state: ExperimentState, trial: TrialState, secret: str) -> TrialRequest:
    """Everything the platform needs to run the trial, with its gateway token: the section of
    the platform it was sent to (one of a hybrid experiment's), with NNI's per-platform
    ``trialCommand`` and ``trialGpuNumber``.

    The parameter record is NNI's (``msg_dispatcher._pack_parameter``): the keeper writes it
    verbatim to ``parameter.cfg``, where ``nni.get_next_parameter()`` reads it. A trial without a
    parameter id is one a person added to a tuned experiment: NNI's customized trial.
    """
    config = state.config
    service = config.service_for(trial.platform) or config.training_services[0]
    return TrialRequest(
        experiment_id=trial.experiment_id,
        trial_id=trial.id,
        sequence_id=trial.sequence_id,
        attempt=trial.attempt,
        trial_command=config.command_for(service),
        code_ref=state.code_ref,
        parameter_record=json.dumps(
            {
                "parameter_id": trial.parameter_id,
                "parameter_source": "algorithm" if trial.parameter_id is not None else "customized",
                "parameters": trial.parameters,
                "parameter_index": 0,
            }
        ),
        trial_gpu_number=config.gpus_for(service),
        training_service=service,
        token=SecretStr(trial_token(secret, trial.experiment_id, trial.id)),
        max_trial_duration=config.max_trial_duration,
        warm_start=config.warm_start is not False,
        warm_preload=config.warm_start.preload if isinstance(config.warm_start, WarmStart) else [],
        heartbeat=timeout / 3 if (timeout := config.retry_policy.heartbeat_timeout) else None,
        grace_period=config.trial_grace_period,
        team=state.team,
        owner=state.owner,
    )
