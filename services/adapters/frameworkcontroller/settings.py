"""Settings of the frameworkcontroller adapter: environment ``TRIALBUS_<NAME>``.

The namespace, roles and storage come with each experiment (``trainingService``); these are
the adapter's own.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from services.adapters.sharefs import ShareSettings


class FrameworkcontrollerSettings(ShareSettings):
    """Besides the shared ones (gateway URL, flush timeout, request timeout, queue note)."""

    #: Where each storage is mounted on this host, as JSON: ``{"nfs://<server><path>": "/mnt/nni",
    #: "azurefile://<account>/<share>": "/mnt/azure"}``. The adapter writes the keeper, the code
    #: and each trial's settings there; the pods see the same files at ``containerMountPath``.
    share_mounts: dict[str, Path] = {}
    #: A kubeconfig file; unset: ``KUBECONFIG``, ``~/.kube/config``, then the pod's service account.
    kubeconfig: Path | None = None
    #: The Azure storage account key for ``storageType: azureStorage`` without a Key Vault.
    azure_storage_key: SecretStr | None = None
    #: Seconds a Framework may stay AttemptPreparing before its trial fails (an experiment's
    #: ``preparingTimeout`` overrides it).
    preparing_timeout: float = Field(default=1800.0, gt=0)
    #: Seconds one watch request lasts (then it resumes from its resourceVersion).
    watch_timeout: int = Field(default=30, gt=0)
    #: Seconds between two full lists, which heal any event a watch missed.
    relist_interval: float = Field(default=60.0, gt=0)
    #: The Kueue LocalQueue (in the experiment's namespace) for the trials of experiments that
    #: name none in ``trainingService.kueue.localQueue``; ``{team}`` is replaced by the
    #: experiment's team (``_`` as ``-``), e.g. ``team-{team}``. Unset: only experiments that
    #: name a LocalQueue use Kueue. See docs/platforms.md, "Kueue".
    kueue_local_queue: str | None = None
