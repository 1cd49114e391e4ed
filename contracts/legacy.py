"""NNI's legacy (v1) experiment config, converted to the v2 layout the way NNI converts it
(``nni/experiment/config/convert.py::to_v2``): a file with ``trainingServicePlatform`` is v1.

Converted: the top-level keys, ``trial``, ``tuner``/``assessor``/``advisor`` (``builtin…Name``
→ ``name``), and the platforms ``local``, ``remote``, ``pai`` and ``frameworkcontroller``.
What NNI itself does not convert (``multiPhase: true``, ``frameworkcontrollerConfig`` with
``pvc`` or ``configPath``) is refused with the reason.
"""

from __future__ import annotations

from typing import Any

TOP = {
    "experimentName": "experimentName", "trialConcurrency": "trialConcurrency",
    "maxExecDuration": "maxExperimentDuration", "maxTrialNum": "maxTrialNumber",
    "maxTrialDuration": "maxTrialDuration", "searchSpacePath": "searchSpaceFile",
    "logDir": "experimentWorkingDirectory", "logLevel": "logLevel", "nniManagerIp": "nniManagerIp",
    "useAnnotation": "useAnnotation", "debug": "debug", "multiThread": "multiThread",
}  # fmt: skip
IGNORED = {"authorName", "trainingServicePlatform", "versionCheck", "logCollection", "multiPhase"}
TRIAL = {"command": "trialCommand", "codeDir": "trialCodeDirectory", "gpuNum": "trialGpuNumber"}
MACHINE = {"ip": "host", "port": "port", "username": "user", "passwd": "password", "sshKeyPath": "sshKeyFile",
           "passphrase": "sshPassphrase", "gpuIndices": "gpuIndices", "maxTrialNumPerGpu": "maxTrialNumberPerGpu",
           "useActiveGpu": "useActiveGpu", "pythonPath": "pythonPath"}  # fmt: skip
PAI_TRIAL = {"nniManagerNFSMountPath": "localStorageMountPoint", "containerNFSMountPath": "containerStorageMountPoint",
             "cpuNum": "trialCpuNumber", "memoryMB": "trialMemorySize", "image": "dockerImage",
             "virtualCluster": "virtualCluster", "paiStorageConfigName": "storageConfigName",
             "paiConfigPath": "openpaiConfigFile"}  # fmt: skip
FC_ROLE = {"name": "name", "taskNum": "taskNumber", "command": "command", "gpuNum": "gpuNumber", "cpuNum": "cpuNumber",
           "memoryMB": "memorySize", "image": "dockerImage"}  # fmt: skip


def is_legacy(data: dict[str, Any]) -> bool:
    return "trainingServicePlatform" in data


def to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """The v2 config of a v1 one; ValueError naming what cannot be converted."""
    if data.get("multiPhase"):
        raise ValueError("multiPhase: true is not supported (NNI 2 removed multi-phase trials)")
    platform = data["trainingServicePlatform"]
    out: dict[str, Any] = {new: data[old] for old, new in TOP.items() if old in data}
    trial = dict(data.get("trial") or {})
    out.update({new: trial.pop(old) for old, new in TRIAL.items() if old in trial})
    for kind in ("tuner", "assessor", "advisor"):
        if isinstance(data.get(kind), dict):
            out[kind] = _algorithm(data[kind], kind)
    converters = {"local": _local, "remote": _remote, "pai": _pai, "frameworkcontroller": _frameworkcontroller}
    if platform not in converters:
        raise ValueError(f"a legacy (v1) config for platform {platform!r} cannot be converted; write it in the v2 "
                         "layout (trainingService: {platform: …})")  # fmt: skip
    out["trainingService"] = converters[platform](data, trial, out)
    unknown = set(data) - set(TOP) - IGNORED - {"trial", "tuner", "assessor", "advisor", f"{platform}Config",
                                                "machineList", "paiConfig"}  # fmt: skip
    if unknown:
        raise ValueError(f"legacy (v1) config: unknown key(s) {', '.join(sorted(unknown))}")
    return out


def _algorithm(section: dict[str, Any], kind: str) -> dict[str, Any]:
    """``builtin<Kind>Name`` → ``name``; ``codeDir`` + ``classFileName`` + ``className`` → ``className:
    <file stem>.<class>`` + ``codeDirectory`` (NNI's ``convert_algo``)."""
    section = dict(section)
    out: dict[str, Any] = {}
    builtin = section.pop(f"builtin{kind.title()}Name", None)
    if builtin is not None:
        out["name"] = builtin
    elif "classFileName" in section or "codeDir" in section:
        file_name, class_name = section.pop("classFileName", None), section.pop("className", None)
        if not isinstance(file_name, str) or not file_name.endswith(".py"):
            raise ValueError(f"{kind}.classFileName must name a .py file in {kind}.codeDir, got {file_name!r}")
        if not isinstance(class_name, str) or not class_name:
            raise ValueError(f"{kind}.className must name the class in {kind}.classFileName")
        if "codeDir" not in section:
            raise ValueError(f"{kind}.codeDir must be set with {kind}.classFileName")
        out["className"] = f"{file_name[:-3]}.{class_name}"
        out["codeDirectory"] = section.pop("codeDir")
    renames = {"className": "className", "classArgs": "classArgs", "gpuIndices": "gpuIndices",
               "codeDir": "codeDirectory"}  # fmt: skip
    out.update({renames.get(k, k): v for k, v in section.items()})
    return out


def _local(data: dict[str, Any], trial: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    local = data.get("localConfig") or {}
    service = {"platform": "local"}
    for old, new in (("gpuIndices", "gpuIndices"), ("maxTrialNumPerGpu", "maxTrialNumberPerGpu"),
                     ("useActiveGpu", "useActiveGpu")):  # fmt: skip
        if old in local:
            service[new] = local[old]
    return service


def _remote(data: dict[str, Any], trial: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    remote = data.get("remoteConfig") or {}
    machines = [{MACHINE.get(k, k): v for k, v in machine.items()} for machine in data.get("machineList") or []]
    service: dict[str, Any] = {"platform": "remote", "machineList": machines}
    if "reuse" in remote:
        service["reuseMode"] = remote["reuse"]
    return service


def _pai(data: dict[str, Any], trial: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    pai = data.get("paiConfig") or {}
    service: dict[str, Any] = {"platform": "openpai"}
    service.update({new: trial.pop(old) for old, new in PAI_TRIAL.items() if old in trial})
    for old, new in (("userName", "username"), ("token", "token"), ("host", "host"), ("reuse", "reuseMode")):
        if old in pai:
            service[new] = pai[old]
    return service


def _frameworkcontroller(data: dict[str, Any], trial: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    fc = data.get("frameworkcontrollerConfig") or {}
    storage = fc.get("storage", "nfs")
    if storage == "pvc" or "configPath" in fc:
        raise ValueError("frameworkcontrollerConfig with a pvc storage or a configPath template is not converted by "
                         "NNI either; use storage nfs or azureStorage")  # fmt: skip
    service: dict[str, Any] = {"platform": "frameworkcontroller"}
    for old, new in (("serviceAccountName", "serviceAccountName"), ("namespace", "namespace"), ("reuse", "reuseMode")):
        if old in fc:
            service[new] = fc[old]
    if storage == "nfs":
        nfs = fc.get("nfs") or {}
        service["storage"] = {"storageType": "nfs", "server": nfs.get("server"), "path": nfs.get("path")}
    else:
        vault, azure = fc.get("keyVault") or {}, fc.get("azureStorage") or {}
        service["storage"] = {"storageType": "azureStorage", "azureAccount": azure.get("accountName"),
                              "azureShare": azure.get("azureShare"), "keyVaultName": vault.get("vaultName"),
                              "keyVaultKey": vault.get("name")}  # fmt: skip
    roles = []
    for role in trial.pop("taskRoles", []) or []:
        converted = {FC_ROLE[k]: v for k, v in role.items() if k in FC_ROLE}
        policy = role.get("frameworkAttemptCompletionPolicy") or {}
        converted["frameworkAttemptCompletionPolicy"] = {
            "minFailedTaskCount": policy.get("minFailedTaskCount", 1),
            "minSucceedTaskCount": policy.get("minSucceededTaskCount", -1),
        }
        roles.append(converted)
    service["taskRoles"] = roles
    if roles and "trialCommand" not in out:
        out["trialCommand"] = roles[0].get("command")
    return service
