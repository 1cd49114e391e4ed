"""Code snapshots for experiments: which ``codeRef`` an experiment runs, and uploads.

An experiment names a snapshot already in the ``code`` object store (``trialCodeRef``), or
a ``trialCodeDirectory`` the dispatcher can read (packed here, honouring ``.nniignore``), or
neither (trials run in their own directory).
"""

from __future__ import annotations

import asyncio

from contracts.experiment import ExperimentConfig
from services.common.api import ApiError
from services.common.bus import Bus
from services.common.code import PackingError, store_archive, upload_code
from services.common.code_archive import check_archive


async def code_ref_for(bus: Bus, config: ExperimentConfig) -> str | None:
    if config.trial_code_ref:
        store = await bus.code_store()
        try:
            await store.get_info(config.trial_code_ref.removeprefix("sha256:"))
        except Exception:
            raise ApiError(
                422,
                f"trialCodeRef {config.trial_code_ref} is not in the code store; upload it first (POST /api/v1/code)",
            ) from None
        return config.trial_code_ref
    if "trial_code_directory" not in config.model_fields_set:
        return None
    try:
        return (await upload_code(bus, config.trial_code_directory)).ref
    except PackingError as exc:
        raise ApiError(
            422,
            f"{exc} (the dispatcher must be able to read it); or upload the code with POST /api/v1/code "
            "and pass trialCodeRef",
        ) from None


async def put_code(bus: Bus, archive: bytes) -> str:
    """Store an uploaded tar.gz (after checking it is one, with safe member names) under its sha256."""
    try:
        ref = await asyncio.to_thread(check_archive, archive)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    return await store_archive(bus, archive, ref)
