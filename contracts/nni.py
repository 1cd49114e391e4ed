"""The base of every section of NNI's experiment config: keys matched ignoring case and
underscores (``ssh_key_file`` = ``sshKeyFile``), unknown keys an error that names them,
camelCase on output; and the fields every ``trainingService`` accepts."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel


def _canonical(key: str) -> str:
    return key.lower().replace("_", "")


class NniModel(BaseModel):
    """A config section whose keys match NNI's rules; camelCase on output."""

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _match_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = {_canonical(name): (info.alias or name) for name, info in cls.model_fields.items()}
        matched: dict[str, Any] = {}
        unknown = []
        for key, value in data.items():
            alias = fields.get(_canonical(str(key)))
            if alias is None:
                unknown.append(str(key))
            else:
                matched[alias] = value
        if unknown:
            raise ValueError(f"{cls.__name__} does not have field(s) {', '.join(sorted(unknown))}")
        return matched


class TrainingService(NniModel):
    """Fields every platform accepts; NNI copies the top-level ones into each."""

    #: The adapter service (``dispatch.<adapter>``) that runs this platform's trials.
    adapter: ClassVar[str]

    platform: str
    trial_command: str | None = None
    trial_code_directory: str | None = None
    trial_gpu_number: int | None = Field(default=None, ge=0)
    nni_manager_ip: str | None = None
    debug: bool | None = None
    reuse_mode: bool = False


def choose_reporting_role(chosen: str | None, roles: list[str], where: str) -> str:
    """The task role whose first instance reports the trial's metrics and exit code:
    ``chosen`` (``reportingTaskRole``, a Trialbus extension) or, without it, the first of
    ``roles`` in the config's order (NNI has no such key: its multi-role configs run
    unchanged). ValueError, listing the roles of ``where``, when ``chosen`` names none."""
    if chosen is None:
        return roles[0]
    if chosen not in roles:
        raise ValueError(f"reportingTaskRole {chosen!r} is not a task role of {where} ({', '.join(roles)})")
    return chosen


def format_validation_error(exc: ValidationError, where: str = "experiment config") -> str:
    """One line per problem, naming the field in the user's own words."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    return f"invalid {where}: " + "; ".join(lines)
