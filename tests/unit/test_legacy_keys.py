"""NNI's v1 config layout, key by key: each key of NNI 2.x's v1 schema (transcribed below from
``nni/tools/nnictl/config_schema.py``) is converted as NNI's converter converts it, has no
effect for a reason docs/nni-v1.md gives, or is refused naming it and why; so is any other
key. The configs changed here are the real v1 examples of :mod:`tests.unit.test_legacy_full`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contracts.legacy import to_v2
from tests.unit.test_legacy_full import v1

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "nni-v1.md").read_text()


# --- refused, naming the key and why ----------------------------------------------------------


def changed(name: str, path: str, value: Any) -> dict[str, Any]:
    """Example ``name`` with ``value`` at the dotted ``path`` (a number indexes a list; ``...=None`` removes)."""
    data = v1(name)
    *parents, last = path.split(".")
    here: Any = data
    for part in parents:
        here = here[int(part)] if isinstance(here, list) else here.setdefault(part, {})
    if isinstance(here, list):
        here[int(last)] = value
    elif value is ...:
        here.pop(last, None)
    else:
        here[last] = value
    return data


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as caught:
        to_v2(data)
    return str(caught.value)


REFUSED = [
    ("local", "multiPhase", True, "multiPhase: NNI 2 removed multi-phase trials"),
    ("local", "useAnnotation", True, "useAnnotation: Trialbus does not expand NNI annotations"),
    ("local", "trial.nasMode", "enas_mode", "trial.nasMode: NNI's NAS modes rewrite annotated trial code"),
    ("local", "tuner.includeIntermediateResults", True, "tuner.includeIntermediateResults: NNI 2 dropped it"),
    ("local", "assessor.gpuNum", 1, "assessor.gpuNum: not a key of NNI's v1 layout here"),
    (
        "local",
        "sharedStorage",
        {"storageType": "NFS", "nfsServer": "10.0.0.1"},
        "sharedStorage: Trialbus does not mount",
    ),
    (
        "local",
        "machineList",
        [{"ip": "10.1.1.1"}],
        "machineList: a section of platform remote, which this config does not use (the platform is local)",
    ),
    ("local", "trial.cpuNum", 2, "trial.cpuNum: an OpenPAI key"),
    ("local", "trial.taskRoles", [], "trial.taskRoles: a frameworkcontroller key"),
    ("local", "trial.worker", {"replicas": 1}, "trial.worker: a trial key of NNI's kubeflow platform"),
    ("local", "trial.shmMB", 512, "trial.shmMB: a trial key of NNI's paiYarn platform"),
    ("local", "trial.imagePullSecrets", [], "trial.imagePullSecrets: a trial key of NNI's adl platform"),
    ("local", "kubeflowConfig", {"operator": "tf-operator"}, "kubeflowConfig: a section of NNI's kubeflow platform"),
    ("local", "amlConfig", {"subscriptionId": "x"}, "amlConfig: a section of NNI's aml platform"),
    ("local", "dltsConfig", {"dashboard": "x"}, "dltsConfig: a section of NNI's dlts platform"),
    (
        "local",
        "hybridConfig",
        {"trainingServicePlatforms": ["local"]},
        "hybridConfig: only read with trainingServicePlatform: hybrid",
    ),
    (
        "local",
        "localConfig.gpuIndex",
        0,
        "localConfig.gpuIndex: not a key of NNI's v1 layout here (this section "
        "takes gpuIndices, maxTrialNumPerGpu, useActiveGpu)",
    ),
    ("local", "maxtrialnum", 3, "maxtrialnum: unknown key; v1 keys are spelled exactly: maxTrialNum"),
    ("local", "maxTrialNumber", 3, "maxTrialNumber: the v2 name of maxTrialNum"),
    ("local", "trainingService", {"platform": "local"}, "trainingService: not a key of NNI's v1 layout"),
    (
        "local",
        "tuner.builtinTunerName",
        "TPE",
        "tuner: set builtinTunerName or codeDir, classFileName, className, not both",
    ),
    ("local", "tuner.classFileName", "my_tuner", "tuner.classFileName: must name a .py file"),
    ("local", "tuner.codeDir", ..., "tuner: set builtinTunerName, or codeDir, classFileName, className together"),
    ("local", "advisor", {"builtinAdvisorName": "Hyperband"}, "advisor: set an advisor, or a tuner"),
    ("remote", "machineList.0.password", "x", "machineList.0.password: the v2 name of passwd"),
    ("remote", "machineList.1.sshKeyFile", "k", "machineList.1.sshKeyFile: the v2 name of sshKeyPath"),
    ("remote", "machineList", ..., "Need to set machineList for remote"),
    ("remote", "remoteConfig.reuseMode", True, "remoteConfig.reuseMode: the v2 name of reuse"),
    ("pai", "paiConfig.passWord", "secret", "paiConfig.passWord: NNI 2 dropped password sign-in to OpenPAI"),
    ("pai", "paiConfig.password", "secret", "paiConfig.password: NNI 2 dropped password sign-in to OpenPAI"),
    ("pai", "paiConfig.maxTrialNumPerGpu", 2, "paiConfig.maxTrialNumPerGpu: several trials per GPU"),
    ("pai", "paiConfig", ..., "Need to set paiConfig for pai"),
    ("pai", "trial.dataDir", "hdfs://10.0.0.1/data", "trial.dataDir: a trial key of NNI's paiYarn platform"),
    (
        "fc_nfs",
        "frameworkcontrollerConfig.configPath",
        "fc.yml",
        "frameworkcontrollerConfig.configPath: a pvc storage or a configPath template is not converted by NNI either",
    ),
    ("fc_nfs", "frameworkcontrollerConfig.storage", "pvc", "frameworkcontrollerConfig.storage: a pvc storage"),
    ("fc_nfs", "frameworkcontrollerConfig.pvc", {"path": "/x"}, "frameworkcontrollerConfig.pvc: a pvc storage"),
    (
        "fc_nfs",
        "frameworkcontrollerConfig.keyVault",
        {"vaultName": "v", "name": "n"},
        "frameworkcontrollerConfig.keyVault: only read with storage azureStorage (storage is nfs)",
    ),
    (
        "fc_nfs",
        "trial.taskRoles.0.privateRegistryAuthPath",
        "auth.json",
        "trial.taskRoles.0.privateRegistryAuthPath: Trialbus does not create image pull secrets",
    ),
    (
        "fc_nfs",
        "trial.taskRoles.0.frameworkAttemptCompletionPolicy.minSucceedTaskCount",
        1,
        "trial.taskRoles.0.frameworkAttemptCompletionPolicy.minSucceedTaskCount: the v2 name of minSucceededTaskCount",
    ),
    (
        "fc_nfs",
        "trial.command",
        "python3 x.py",
        "trial.command: not a trial key for frameworkcontroller: each of trial.taskRoles has its own",
    ),
    ("fc_nfs", "frameworkcontrollerConfig", ..., "Need to set frameworkcontrollerConfig for frameworkcontroller"),
    ("hybrid", "machineList", ..., "Need to set machineList for remote in hybrid mode"),
    ("hybrid", "paiConfig", ..., "Need to set paiConfig for pai in hybrid mode"),
    (
        "hybrid",
        "hybridConfig.trainingServicePlatforms",
        ["local", "remote"],
        "paiConfig: a section of platform pai, which this config does not use (hybridConfig lists local, remote)",
    ),
    ("hybrid", "hybridConfig.trainingServicePlatforms", ["local"], "trial.cpuNum: an OpenPAI key"),
    ("hybrid", "hybridConfig.platforms", ["local"], "hybridConfig.platforms: unknown key"),
]


@pytest.mark.parametrize(("name", "path", "value", "message"), REFUSED, ids=[f"{r[0]}:{r[1]}" for r in REFUSED])
def test_a_key_that_cannot_be_honoured_is_refused_naming_it_and_why(name, path, value, message) -> None:
    assert message in refusal(changed(name, path, value))


def test_every_refused_key_is_named_at_once() -> None:
    data = changed("pai", "paiConfig.passWord", "secret")
    data["trial"]["shmMB"] = 512
    data["multiPhase"] = True
    data["colour"] = "blue"
    message = refusal(data)
    assert message.startswith("legacy (v1) config: ")
    for named in ("paiConfig.passWord:", "trial.shmMB:", "multiPhase:", "colour: not a key of NNI's v1 layout"):
        assert named in message
    assert "secret" not in message, "a refused password is named, never shown"


@pytest.mark.parametrize("platform", ["kubeflow", "aml", "dlts", "adl", "paiYarn"])
def test_nni_platforms_trialbus_does_not_have_are_refused_naming_those_it_has(platform: str) -> None:
    message = refusal(changed("local", "trainingServicePlatform", platform))
    assert f"trainingServicePlatform: {platform} is an NNI platform Trialbus does not have" in message
    assert "Trialbus runs local, remote, pai, frameworkcontroller, and hybrid of local, remote, pai" in message


@pytest.mark.parametrize(
    ("listed", "message"),
    [
        (["local", "aml"], "aml (an NNI platform Trialbus does not have)"),
        (["kubeflow", "dlts", "adl"], "kubeflow (an NNI platform Trialbus does not have), dlts (an NNI platform"),
        (["local", "frameworkcontroller"], "frameworkcontroller (not in NNI's v1 hybrid mode; write the config in v2"),
        (["local", "local"], "local listed more than once"),
        ([], "hybridConfig.trainingServicePlatforms: must list the platforms"),
    ],
)
def test_a_v1_hybrid_list_names_the_platforms_it_cannot_run(listed: list[str], message: str) -> None:
    found = refusal(changed("hybrid", "hybridConfig.trainingServicePlatforms", listed))
    assert message in found
    if listed and listed != ["local", "local"]:
        assert "a v1 hybrid config may list local, remote, pai" in found


def test_an_unknown_platform_is_refused_with_v1_s_name_for_openpai() -> None:
    assert "unknown platform 'openpai'" in refusal(changed("pai", "trainingServicePlatform", "openpai"))
    assert "(v1 calls openpai pai)" in refusal(changed("pai", "trainingServicePlatform", "openpai"))


# --- no effect: accepted, and nothing else changes ---------------------------------------------

NO_EFFECT = [
    ("authorName", "someone else"),
    ("description", "a longer story"),
    ("versionCheck", True),
    ("logCollection", "http"),
    ("multiPhase", False),
    ("trial.nasMode", "classic_mode"),
    ("tuner.includeIntermediateResults", False),
]


@pytest.mark.parametrize(("path", "value"), NO_EFFECT)
def test_keys_without_effect_here_are_accepted_and_change_nothing(path: str, value: Any) -> None:
    assert to_v2(changed("remote", path, value)) == to_v2(changed("remote", path, ...))


@pytest.mark.parametrize(
    ("name", "path", "value"),
    [
        ("pai", "paiConfig.useActiveGpu", True),
        ("pai", "paiConfig.maxTrialNumPerGpu", 1),
        ("fc_azure", "frameworkcontrollerConfig.uploadRetryCount", 5),
    ],
)
def test_platform_keys_without_effect_here_change_nothing(name: str, path: str, value: Any) -> None:
    assert to_v2(changed(name, path, value)) == to_v2(changed(name, path, ...))


def test_pai_resources_in_paiconfig_win_over_the_trial_s_as_in_nni() -> None:
    data = v1("pai")
    data["paiConfig"].update(gpuNum=1, cpuNum=4, memoryMB=16384)
    service = to_v2(data)["trainingService"]
    assert (service["trialGpuNumber"], service["trialCpuNumber"], service["trialMemorySize"]) == (1, 4, 16384)


def test_assessor_and_advisor_classes_convert_as_the_tuner_s() -> None:
    data = v1("remote")
    data["assessor"] = {
        "codeDir": "assessors",
        "classFileName": "stop.py",
        "className": "Stopper",
        "classArgs": {"patience": 3},
    }
    assert to_v2(data)["assessor"] == {
        "className": "stop.Stopper",
        "codeDirectory": "assessors",
        "classArgs": {"patience": 3},
    }
    del data["tuner"], data["assessor"]
    data["advisor"] = {"builtinAdvisorName": "BOHB", "classArgs": {"optimize_mode": "maximize"}, "gpuIndices": 1}
    converted = to_v2(data)
    assert converted["advisor"] == {"name": "BOHB", "classArgs": {"optimize_mode": "maximize"}}
    assert converted["tunerGpuIndices"] == 1 and "tuner" not in converted


# --- every key of NNI 2.x's v1 schema (nni/tools/nnictl/config_schema.py) ---------------------

COMMON = [
    "authorName",
    "experimentName",
    "description",
    "trialConcurrency",
    "maxExecDuration",
    "maxTrialDuration",
    "maxTrialNum",
    "searchSpacePath",
    "multiPhase",
    "multiThread",
    "nniManagerIp",
    "logDir",
    "debug",
    "versionCheck",
    "logLevel",
    "logCollection",
    "useAnnotation",
    "tuner.builtinTunerName",
    "tuner.classArgs",
    "tuner.includeIntermediateResults",
    "tuner.gpuIndices",
    "sharedStorage.storageType",
    "sharedStorage.localMountPoint",
    "sharedStorage.remoteMountPoint",
    "sharedStorage.nfsServer",
    "sharedStorage.exportedDirectory",
    "sharedStorage.storageAccountName",
    "sharedStorage.storageAccountKey",
    "sharedStorage.containerName",
    "sharedStorage.localMounted",
]
TRIAL_KEYS = ["trial.command", "trial.codeDir", "trial.gpuNum", "trial.nasMode"]
PAI_TRIAL_KEYS = [
    "trial.nniManagerNFSMountPath",
    "trial.containerNFSMountPath",
    "trial.cpuNum",
    "trial.memoryMB",
    "trial.image",
    "trial.virtualCluster",
    "trial.paiStorageConfigName",
    "trial.paiConfigPath",
]
MACHINE_KEYS = [
    f"machineList.0.{k}"
    for k in (
        "ip",
        "port",
        "username",
        "sshKeyPath",
        "passphrase",
        "gpuIndices",
        "maxTrialNumPerGpu",
        "useActiveGpu",
        "pythonPath",
        "passwd",
    )
]
PAI_CONFIG_KEYS = [
    f"paiConfig.{k}"
    for k in (
        "userName",
        "passWord",
        "token",
        "host",
        "reuse",
        "gpuNum",
        "cpuNum",
        "memoryMB",
        "maxTrialNumPerGpu",
        "useActiveGpu",
    )
]
SCHEMA = {
    "local": [
        *COMMON,
        *TRIAL_KEYS,
        "localConfig.gpuIndices",
        "localConfig.maxTrialNumPerGpu",
        "localConfig.useActiveGpu",
    ],
    "remote": [*COMMON, *TRIAL_KEYS, *MACHINE_KEYS, "remoteConfig.reuse"],
    "pai": [*COMMON, "trial.codeDir", "trial.command", "trial.gpuNum", *PAI_TRIAL_KEYS, *PAI_CONFIG_KEYS],
    "fc_nfs": [
        *COMMON,
        "trial.codeDir",
        "trial.nasMode",
        "frameworkcontrollerConfig.storage",
        "frameworkcontrollerConfig.serviceAccountName",
        "frameworkcontrollerConfig.nfs.server",
        "frameworkcontrollerConfig.nfs.path",
        "frameworkcontrollerConfig.namespace",
        "frameworkcontrollerConfig.configPath",
        "frameworkcontrollerConfig.reuse",
        "frameworkcontrollerConfig.pvc.path",
        *[
            f"trial.taskRoles.0.{k}"
            for k in (
                "name",
                "taskNum",
                "command",
                "gpuNum",
                "cpuNum",
                "memoryMB",
                "image",
                "privateRegistryAuthPath",
                "frameworkAttemptCompletionPolicy.minFailedTaskCount",
                "frameworkAttemptCompletionPolicy.minSucceededTaskCount",
            )
        ],
    ],
    "fc_azure": [
        "frameworkcontrollerConfig.keyVault.vaultName",
        "frameworkcontrollerConfig.keyVault.name",
        "frameworkcontrollerConfig.azureStorage.accountName",
        "frameworkcontrollerConfig.azureStorage.azureShare",
        "frameworkcontrollerConfig.uploadRetryCount",
    ],
    "hybrid": [
        *COMMON,
        *TRIAL_KEYS,
        *PAI_TRIAL_KEYS,
        "hybridConfig.trainingServicePlatforms",
        *MACHINE_KEYS,
        *PAI_CONFIG_KEYS,
        "remoteConfig.reuse",
        "localConfig.useActiveGpu",
    ],
}
#: Accepted whatever their value, and dropped: docs/nni-v1.md says why each changes nothing here.
DROPPED = {
    "authorName",
    "description",
    "versionCheck",
    "logCollection",
    "paiConfig.useActiveGpu",
    "frameworkcontrollerConfig.uploadRetryCount",
}
KEYS = [(name, path) for name, paths in SCHEMA.items() for path in paths]


@pytest.mark.parametrize(("name", "path"), KEYS, ids=[f"{n}:{p}" for n, p in KEYS])
def test_every_v1_schema_key_is_converted_refused_by_name_or_documented_as_without_effect(name, path) -> None:
    # A value no example holds: converted, it must show in the v2 config; refused, the error names the key.
    data = changed(name, path, "sample-value")
    try:
        converted = to_v2(data)
    except ValueError as exc:
        message = str(exc)
        assert "not a key of NNI's v1 layout" not in message and "unknown key" not in message, message
        parts = path.split(".")
        assert any(f"{'.'.join(parts[:n])}:" in message for n in range(len(parts), 0, -1)), message
        return
    if path in DROPPED:
        assert converted == to_v2(changed(name, path, ...))
    else:
        assert "sample-value" in json.dumps(converted), f"{path} was dropped without a word"


def _documented(path: str) -> str:
    """How docs/nni-v1.md writes a key: list items as ``[]``."""
    return "".join("[]" if part.isdigit() else f".{part}" for part in path.split(".")).lstrip(".")


OTHER_PLATFORMS = [
    "kubeflowConfig.operator",
    "kubeflowConfig.apiVersion",
    "kubeflowConfig.storage",
    "kubeflowConfig.nfs.server",
    "kubeflowConfig.nfs.path",
    "kubeflowConfig.reuse",
    "kubeflowConfig.namespace",
    "kubeflowConfig.keyVault.vaultName",
    "kubeflowConfig.keyVault.name",
    "kubeflowConfig.azureStorage.accountName",
    "kubeflowConfig.azureStorage.azureShare",
    "kubeflowConfig.uploadRetryCount",
    *[
        f"trial.{role}.{k}"
        for role in ("ps", "master", "worker")
        for k in ("replicas", "command", "gpuNum", "cpuNum", "memoryMB", "image", "privateRegistryAuthPath")
    ],
    "amlConfig.subscriptionId",
    "amlConfig.resourceGroup",
    "amlConfig.workspaceName",
    "amlConfig.computeTarget",
    "amlConfig.maxTrialNumPerGpu",
    "amlConfig.useActiveGpu",
    "dltsConfig.dashboard",
    "dltsConfig.cluster",
    "dltsConfig.team",
    "dltsConfig.email",
    "dltsConfig.password",
    "trial.namespace",
    "trial.imagePullSecrets[].name",
    "trial.nfs.server",
    "trial.nfs.path",
    "trial.nfs.containerMountPath",
    "trial.adaptive",
    "trial.checkpoint.storageClass",
    "trial.checkpoint.storageSize",
    "trial.memorySize",
    "trial.authFile",
    "trial.shmMB",
    "trial.dataDir",
    "trial.outputDir",
    "trial.portList[].label",
    "trial.portList[].beginAt",
    "trial.portList[].portNumber",
]


def test_the_docs_list_every_v1_key() -> None:
    keys = (
        {_documented(path) for _, path in KEYS}
        | set(OTHER_PLATFORMS)
        | {
            "trainingServicePlatform",
            "assessor.builtinAssessorName",
            "advisor.builtinAdvisorName",
            "tuner.codeDir",
            "tuner.classFileName",
            "tuner.className",
        }
    )
    missing = sorted(key for key in keys if f"`{key}`" not in DOCS)
    assert not missing, f"docs/nni-v1.md does not list {missing}"
