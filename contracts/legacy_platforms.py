"""The platform sections of NNI's v1 config, each converted to its v2 ``trainingService``
section as NNI's converter (``nni/experiment/config/convert.py``) converts it: ``localConfig``;
``remoteConfig`` and ``machineList``; ``paiConfig`` and the OpenPAI keys under ``trial``;
``frameworkcontrollerConfig`` and ``trial.taskRoles``.

Where NNI's converter loses a key that changes how trials run, the key is converted to what
it means in v2 (``namespace``; ``passphrase`` → ``sshPassphrase``, which NNI names wrongly) or
refused (``privateRegistryAuthPath``, a pvc storage, a ``configPath`` template).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts.legacy_sections import Keys, convert, mapping

#: v1 platform → its v2 name, for the platforms Trialbus has.
PLATFORMS = {"local": "local", "remote": "remote", "pai": "openpai", "frameworkcontroller": "frameworkcontroller"}
#: NNI's v1 platforms Trialbus has no adapter for.
NOT_HERE = ("kubeflow", "aml", "dlts", "adl", "paiYarn")
#: What NNI's v1 ``hybridConfig.trainingServicePlatforms`` may list that Trialbus has (NNI also takes aml).
HYBRID = ("local", "remote", "pai")
#: Each platform's own top-level sections; a section of a platform the config does not use is refused.
SECTIONS = {
    "localConfig": "local",
    "remoteConfig": "remote",
    "machineList": "remote",
    "paiConfig": "pai",
    "frameworkcontrollerConfig": "frameworkcontroller",
    "hybridConfig": "hybrid",
    "kubeflowConfig": "kubeflow",
    "amlConfig": "aml",
    "dltsConfig": "dlts",
    "paiYarnConfig": "paiYarn",
}

LOCAL = Keys(
    moved={"gpuIndices": "gpuIndices", "maxTrialNumPerGpu": "maxTrialNumberPerGpu", "useActiveGpu": "useActiveGpu"}
)
REMOTE = Keys(moved={"reuse": "reuseMode"})
MACHINE = Keys(
    moved={
        "ip": "host",
        "port": "port",
        "username": "user",
        "passwd": "password",
        "sshKeyPath": "sshKeyFile",
        "passphrase": "sshPassphrase",
        "gpuIndices": "gpuIndices",
        "maxTrialNumPerGpu": "maxTrialNumberPerGpu",
        "useActiveGpu": "useActiveGpu",
        "pythonPath": "pythonPath",
    }
)

#: The OpenPAI keys under ``trial`` → the openpai section's.
PAI_TRIAL = {
    "nniManagerNFSMountPath": "localStorageMountPoint",
    "containerNFSMountPath": "containerStorageMountPoint",
    "cpuNum": "trialCpuNumber",
    "memoryMB": "trialMemorySize",
    "image": "dockerImage",
    "virtualCluster": "virtualCluster",
    "paiStorageConfigName": "storageConfigName",
    "paiConfigPath": "openpaiConfigFile",
}
_PASSWORD = "NNI 2 dropped password sign-in to OpenPAI: use an application token (paiConfig.token)"
PAI = Keys(
    moved={
        "userName": "username",
        "token": "token",
        "host": "host",
        "reuse": "reuseMode",
        "gpuNum": "trialGpuNumber",
        "cpuNum": "trialCpuNumber",
        "memoryMB": "trialMemorySize",
    },
    no_effect=frozenset({"useActiveGpu"}),
    refused={"passWord": _PASSWORD, "password": _PASSWORD},
    refused_if={
        "maxTrialNumPerGpu": (
            lambda v: v not in (None, 1),
            "several trials per GPU in one OpenPAI job is not done here (each trial has its job's GPUs); remove it",
        )
    },
)

TEMPLATE = (
    "a pvc storage or a configPath template is not converted by NNI either; use storage nfs or "
    "azureStorage, and trial.taskRoles"
)
FRAMEWORKCONTROLLER = Keys(
    moved={"serviceAccountName": "serviceAccountName", "namespace": "namespace", "reuse": "reuseMode"},
    no_effect=frozenset({"uploadRetryCount"}),
    refused={"configPath": TEMPLATE, "pvc": TEMPLATE},
    nested=frozenset({"storage", "nfs", "keyVault", "azureStorage"}),
)
NFS = Keys(moved={"server": "server", "path": "path"})
KEY_VAULT = Keys(moved={"vaultName": "keyVaultName", "name": "keyVaultKey"})
AZURE = Keys(moved={"accountName": "azureAccount", "azureShare": "azureShare"})
ROLE = Keys(
    moved={
        "name": "name",
        "taskNum": "taskNumber",
        "command": "command",
        "gpuNum": "gpuNumber",
        "cpuNum": "cpuNumber",
        "memoryMB": "memorySize",
        "image": "dockerImage",
    },
    refused={
        "privateRegistryAuthPath": "Trialbus does not create image pull secrets from a registry auth file; "
        "give the pods' service account (serviceAccountName) imagePullSecrets instead"
    },
    nested=frozenset({"frameworkAttemptCompletionPolicy"}),
)
POLICY = Keys(moved={"minFailedTaskCount": "minFailedTaskCount", "minSucceededTaskCount": "minSucceedTaskCount"})


def need(section: str, platform: str, hybrid: bool, problems: list[str]) -> None:
    """NNI's message for a platform whose section is missing."""
    problems.append(f"Need to set {section} for {platform}" + (" in hybrid mode" if hybrid else ""))


def local(data: dict[str, Any], hybrid: bool, problems: list[str]) -> dict[str, Any]:
    return {"platform": "local", **convert(data.get("localConfig"), "localConfig", LOCAL, problems)}


def remote(data: dict[str, Any], hybrid: bool, problems: list[str]) -> dict[str, Any]:
    service = {"platform": "remote", **convert(data.get("remoteConfig"), "remoteConfig", REMOTE, problems)}
    machines = data.get("machineList")
    if not machines:
        need("machineList", "remote", hybrid, problems)
    elif not isinstance(machines, list):
        problems.append("machineList: must be a list of machines ({ip, username, sshKeyPath or passwd, …})")
    else:
        service["machineList"] = [convert(m, f"machineList.{i}", MACHINE, problems) for i, m in enumerate(machines)]
    return service


def pai(data: dict[str, Any], hybrid: bool, problems: list[str]) -> dict[str, Any]:
    """The OpenPAI keys under ``trial``, then ``paiConfig``'s (which win, as in NNI's converter)."""
    trial = data.get("trial")
    if not isinstance(trial, dict):
        trial = {}
    service = {"platform": "openpai"}
    service.update({new: trial[old] for old, new in PAI_TRIAL.items() if trial.get(old) is not None})
    if not data.get("paiConfig"):
        need("paiConfig", "pai", hybrid, problems)
    service.update(convert(data.get("paiConfig"), "paiConfig", PAI, problems))
    return service


def frameworkcontroller(data: dict[str, Any], hybrid: bool, problems: list[str]) -> dict[str, Any]:
    where = "frameworkcontrollerConfig"
    if not data.get(where):
        need(where, "frameworkcontroller", hybrid, problems)
    fc = mapping(data.get(where), where, problems)
    service = {"platform": "frameworkcontroller", **convert(fc, where, FRAMEWORKCONTROLLER, problems)}
    storage = _storage(fc, problems)
    if storage is not None:
        service["storage"] = storage
    trial = data.get("trial")
    if not isinstance(trial, dict):
        trial = {}
    roles = trial.get("taskRoles") or []
    if not isinstance(roles, list):
        problems.append("trial.taskRoles: must be a list of task roles")
        roles = []
    service["taskRoles"] = [_role(role, f"trial.taskRoles.{i}", problems) for i, role in enumerate(roles)]
    return service


def _storage(fc: dict[str, Any], problems: list[str]) -> dict[str, Any] | None:
    """``storage`` + ``nfs`` or ``keyVault`` + ``azureStorage`` → v2's ``storage`` (NNI's
    choice when ``storage`` is unset: nfs if an ``nfs`` section is given, else azureStorage)."""
    where = "frameworkcontrollerConfig"
    kind = fc.get("storage") or ("nfs" if "nfs" in fc else "azureStorage")
    if kind == "pvc":
        problems.append(f"{where}.storage: {TEMPLATE}")
        return None
    if kind not in ("nfs", "azureStorage"):
        problems.append(f"{where}.storage: {kind!r} is not one of nfs, azureStorage")
        return None
    other = ("keyVault", "azureStorage") if kind == "nfs" else ("nfs",)
    problems.extend(
        f"{where}.{key}: only read with storage {key if key == 'nfs' else 'azureStorage'} (storage is {kind})"
        for key in other
        if key in fc
    )
    if kind == "nfs":
        return {"storageType": "nfs", **convert(fc.get("nfs"), f"{where}.nfs", NFS, problems)}
    azure = convert(fc.get("azureStorage"), f"{where}.azureStorage", AZURE, problems)
    vault = convert(fc.get("keyVault"), f"{where}.keyVault", KEY_VAULT, problems)
    return {"storageType": "azureStorage", **azure, **vault}


def _role(role: Any, where: str, problems: list[str]) -> dict[str, Any]:
    out = convert(role, where, ROLE, problems)
    policy = role.get("frameworkAttemptCompletionPolicy") if isinstance(role, dict) else None
    if policy:
        out["frameworkAttemptCompletionPolicy"] = convert(
            policy, f"{where}.frameworkAttemptCompletionPolicy", POLICY, problems
        )
    return out


#: v1 platform → its converter: (the whole v1 config, hybrid?, problems) → the v2 section.
CONVERTERS: dict[str, Callable[[dict[str, Any], bool, list[str]], dict[str, Any]]] = {
    "local": local,
    "remote": remote,
    "pai": pai,
    "frameworkcontroller": frameworkcontroller,
}
