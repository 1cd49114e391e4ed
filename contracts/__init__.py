"""Wire contracts of Trialbus: every message on the bus, every subject, stream and bucket.

Services share nothing but this package and the streams it defines (docs/architecture.md,
principle 1). Models are frozen pydantic v2 classes with a ``kind`` and a ``v``
field; readers ignore unknown fields in production and forbid them when
``TRIALBUS_CONTRACTS_STRICT=1`` (the test suite sets it).
"""

from contracts.base import Contract, ContractError
from contracts.experiment import ExperimentConfig, LocalConfig, TrainingService, load_experiment_config
from contracts.messages import (
    CancelReply,
    CancelRequest,
    CheckReply,
    CheckRequest,
    ClusterStatus,
    DrainReply,
    DrainRequest,
    GpuStatus,
    LogReply,
    LogRequest,
    MachineStatus,
    MetricRecord,
    MetricType,
    PlatformStatus,
    TrialEvent,
    TrialRequest,
)
from contracts.state import ExperimentState, ExperimentStatus, TrialState, TrialStatus
from contracts.version import VERSION

__all__ = [
    "VERSION",
    "CancelReply",
    "CancelRequest",
    "CheckReply",
    "CheckRequest",
    "Contract",
    "ContractError",
    "DrainReply",
    "DrainRequest",
    "ExperimentConfig",
    "ExperimentState",
    "ExperimentStatus",
    "GpuStatus",
    "LocalConfig",
    "LogReply",
    "LogRequest",
    "ClusterStatus",
    "MachineStatus",
    "MetricRecord",
    "MetricType",
    "PlatformStatus",
    "TrainingService",
    "TrialEvent",
    "TrialRequest",
    "TrialState",
    "TrialStatus",
    "load_experiment_config",
]
