"""An experiment config as a client sends it: read and completed on the user's machine."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from contracts import ExperimentConfig
from contracts.experiment import format_validation_error, load_experiment_config, read_job_template, read_key_files


def as_config(config: ExperimentConfig | Mapping[str, Any] | str | Path) -> ExperimentConfig:
    """An ExperimentConfig from a model, a dict (paths relative to the cwd) or a YAML file.

    As NNI does, a ``searchSpaceFile`` is read into ``searchSpace`` here, on the user's
    machine, so the dispatcher never needs the file; so are remote machines' ``sshKeyFile``.
    """
    if isinstance(config, str | Path):
        config = load_experiment_config(config)
    elif not isinstance(config, ExperimentConfig):
        try:
            config = ExperimentConfig.model_validate(dict(config))
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc)) from None
        config = read_job_template(read_key_files(config))
    update: dict[str, Any] = {"trial_code_directory": str(Path(config.trial_code_directory).expanduser().resolve())}
    if config.search_space is None and config.search_space_file:
        path = Path(config.search_space_file).expanduser()
        try:
            space = yaml.safe_load(path.read_text())  # JSON is YAML
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read searchSpaceFile {path}: {exc}") from None
        if not isinstance(space, dict):
            raise ValueError(f"searchSpaceFile {path} must hold a mapping of parameter names to specs")
        update["search_space"] = space
    return config.model_copy(update=update)
