"""NNI's legacy (v1) experiment config, converted to the v2 layout the way NNI converts it
(``nni/experiment/config/convert.py::to_v2``): a file with ``trainingServicePlatform`` is v1.

Every key of NNI 2.x's v1 schema (``nni/tools/nnictl/config_schema.py``) is converted as
NNI's converter converts it, accepted with no effect where it changes nothing here
(``authorName``, ``versionCheck``…), or refused with its dotted path and the reason; so is
any key that is not in the schema. A key NNI's converter drops although it changes how
trials run is converted to its v2 meaning (``maxTrialDuration``, ``namespace``) or refused
(``includeIntermediateResults: true``, ``sharedStorage``…). ``docs/nni-v1.md`` has the table.

NNI's v1 hybrid form (``trainingServicePlatform: hybrid`` with ``hybridConfig:
{trainingServicePlatforms: [local, remote, pai]}``) becomes a ``trainingService`` list, one
section per listed platform in its order. The platforms are in :mod:`contracts.legacy_platforms`.
"""

from __future__ import annotations

import copy
from typing import Any

from contracts.legacy_platforms import CONVERTERS, HYBRID, NOT_HERE, PAI_TRIAL, PLATFORMS, SECTIONS
from contracts.legacy_sections import Keys, convert, mapping, truthy

ALGORITHMS = ("tuner", "assessor", "advisor")
#: How every refusal begins.
REFUSED = "legacy (v1) config: "

TOP = Keys(
    moved={
        "experimentName": "experimentName",
        "trialConcurrency": "trialConcurrency",
        "maxExecDuration": "maxExperimentDuration",
        "maxTrialNum": "maxTrialNumber",
        "maxTrialDuration": "maxTrialDuration",
        "searchSpacePath": "searchSpaceFile",
        "multiThread": "multiThread",
        "nniManagerIp": "nniManagerIp",
        "logDir": "experimentWorkingDirectory",
        "debug": "debug",
        "logLevel": "logLevel",
        "useAnnotation": "useAnnotation",
    },
    no_effect=frozenset({"authorName", "description", "versionCheck", "logCollection", "multiPhase"}),
    refused={
        "sharedStorage": "Trialbus does not mount NNI's shared storage where trials run (it ships the trial "
        "code itself); mount the storage on those machines yourself and remove this section"
    },
    refused_if={
        "multiPhase": (truthy, "NNI 2 removed multi-phase trials (its converter refuses them too)"),
        "useAnnotation": (
            truthy,
            "Trialbus does not expand NNI annotations (a search space written as comments "
            "in the trial code): give searchSpacePath and read parameters with "
            "nni.get_next_parameter()",
        ),
    },
    nested=frozenset({"trainingServicePlatform", "trial", *ALGORITHMS, *SECTIONS}),
)

#: The trial keys every platform of ours has → top-level v2 keys.
TRIAL = {"command": "trialCommand", "codeDir": "trialCodeDirectory", "gpuNum": "trialGpuNumber"}
_NAS_MODE = (
    lambda v: v not in (None, "classic_mode"),
    "NNI's NAS modes rewrite annotated trial code, which Trialbus does not do (classic_mode, the default, is accepted)",
)
_INTERMEDIATE = (
    "NNI 2 dropped it, and Trialbus does not hand the tuner an early-stopped trial's last "
    "intermediate result as its final one"
)
#: Trial keys of NNI's v1 platforms Trialbus does not have.
OTHER_TRIAL = {
    **dict.fromkeys(("ps", "master", "worker"), "kubeflow"),
    **dict.fromkeys(("authFile", "shmMB", "dataDir", "outputDir", "portList"), "paiYarn"),
    **dict.fromkeys(("namespace", "imagePullSecrets", "nfs", "adaptive", "checkpoint", "memorySize"), "adl"),
}


def is_legacy(data: dict[str, Any]) -> bool:
    return "trainingServicePlatform" in data


def to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """The v2 config of a v1 one (sharing nothing with ``data``); ValueError naming every key
    that is refused, and why."""
    data = copy.deepcopy(data)
    platforms, hybrid = _platforms(data)
    problems: list[str] = []
    out = convert(data, "", TOP, problems)
    out.update(convert(data.get("trial"), "trial", _trial_keys(platforms), problems))
    for kind in ALGORITHMS:
        if data.get(kind):
            out[kind] = _algorithm(data[kind], kind, out, problems)
    if data.get("advisor") and (data.get("tuner") or data.get("assessor")):
        problems.append("advisor: set an advisor, or a tuner (and an assessor), not both (NNI's v1 rule)")
    used = {*platforms, "hybrid"} if hybrid else set(platforms)
    for section, owner in SECTIONS.items():
        if section in data and owner not in used:
            problems.append(f"{section}: {_unused(owner, data['trainingServicePlatform'], platforms)}")
    services = [CONVERTERS[platform](data, hybrid, problems) for platform in platforms]
    if problems:
        raise ValueError(REFUSED + "; ".join(problems))
    out["trainingService"] = services if hybrid else services[0]
    roles = services[0].get("taskRoles")
    if roles and not out.get("trialCommand"):  # NNI's converter: the first role's command
        out["trialCommand"] = roles[0].get("command")
    return out


def _platforms(data: dict[str, Any]) -> tuple[list[str], bool]:
    """The v1 platforms the config runs on (several in hybrid mode), and whether it is hybrid;
    ValueError for a platform Trialbus does not have."""
    ours = f"Trialbus runs {', '.join(PLATFORMS)}, and hybrid of {', '.join(HYBRID)}"
    platform = data["trainingServicePlatform"]
    if not isinstance(platform, str):
        raise ValueError(f"{REFUSED}trainingServicePlatform: must name one platform, not {platform!r}; {ours}")
    if platform in PLATFORMS:
        return [platform], False
    if platform in NOT_HERE:
        raise ValueError(
            f"{REFUSED}trainingServicePlatform: {platform} is an NNI platform Trialbus does not have; {ours}"
        )
    if platform != "hybrid":
        raise ValueError(
            f"{REFUSED}trainingServicePlatform: unknown platform {platform!r}; {ours}"
            + (" (v1 calls openpai pai)" if platform == "openpai" else "")
        )
    problems: list[str] = []
    hybrid = mapping(data.get("hybridConfig"), "hybridConfig", problems)
    problems.extend(
        f"hybridConfig.{key}: unknown key; hybridConfig takes trainingServicePlatforms"
        for key in hybrid
        if key != "trainingServicePlatforms"
    )
    listed = hybrid.get("trainingServicePlatforms")
    if not listed or not isinstance(listed, list):
        problems.append("hybridConfig.trainingServicePlatforms: must list the platforms, e.g. [local, remote]")
        listed = []
    not_here = [str(p) for p in listed if p not in HYBRID]
    if not_here:
        why = ", ".join(f"{p} ({_why_not_hybrid(p)})" for p in not_here)
        problems.append(
            f"hybridConfig.trainingServicePlatforms: {why}; a v1 hybrid config may list {', '.join(HYBRID)}"
        )
    twice = sorted({str(p) for p in listed if listed.count(p) > 1})
    if twice:
        problems.append(f"hybridConfig.trainingServicePlatforms: {', '.join(twice)} listed more than once")
    if problems:
        raise ValueError(REFUSED + "; ".join(problems))
    return listed, True


def _why_not_hybrid(platform: str) -> str:
    if platform in NOT_HERE:
        return "an NNI platform Trialbus does not have"
    if platform == "frameworkcontroller":
        return "not in NNI's v1 hybrid mode; write the config in v2, with a trainingService list"
    return "not an NNI v1 platform"


def _unused(owner: str, platform: str, platforms: list[str]) -> str:
    if owner in NOT_HERE:
        return f"a section of NNI's {owner} platform, which Trialbus does not have; remove it"
    if owner == "hybrid":
        return "only read with trainingServicePlatform: hybrid"
    runs = f"hybridConfig lists {', '.join(platforms)}" if platform == "hybrid" else f"the platform is {platform}"
    return f"a section of platform {owner}, which this config does not use ({runs}); remove it"


def _trial_keys(platforms: list[str]) -> Keys:
    """The ``trial`` keys of NNI's v1 schema for ``platforms``: moved to the top, read by a
    platform's converter, or refused with the platform they belong to."""
    refused = {
        key: f"a trial key of NNI's {owner} platform, which Trialbus does not have"
        for key, owner in OTHER_TRIAL.items()
    }
    nested: set[str] = set()
    if "pai" in platforms:
        nested.update(PAI_TRIAL)
    else:
        refused.update(
            dict.fromkeys(
                PAI_TRIAL,
                "an OpenPAI key (trainingServicePlatform pai, or hybrid with pai); "
                f"this config runs on {', '.join(platforms)}",
            )
        )
    moved = dict(TRIAL)
    if "frameworkcontroller" in platforms:
        nested.add("taskRoles")
        for key in ("command", "gpuNum"):
            del moved[key]
            refused[key] = "not a trial key for frameworkcontroller: each of trial.taskRoles has its own"
    else:
        refused["taskRoles"] = "a frameworkcontroller key (trainingServicePlatform frameworkcontroller)"
    return Keys(moved=moved, refused=refused, refused_if={"nasMode": _NAS_MODE}, nested=frozenset(nested))


def _algorithm(section: Any, kind: str, out: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """``builtin<Kind>Name`` → ``name``; ``codeDir`` + ``classFileName`` + ``className`` →
    ``className: <file stem>.<class>`` + ``codeDirectory``; ``classArgs`` as it is;
    ``gpuIndices`` → the top-level ``tunerGpuIndices`` (NNI's ``convert_algo`` and ``to_v2``)."""
    builtin = f"builtin{kind.title()}Name"
    custom = ("codeDir", "classFileName", "className")
    keys = Keys(
        moved={"classArgs": "classArgs"},
        nested=frozenset({builtin, *custom, "gpuIndices"}),
        refused_if={"includeIntermediateResults": (truthy, _INTERMEDIATE)},
    )
    args = convert(section, kind, keys, problems)
    if not isinstance(section, dict):
        return args
    given = [key for key in custom if key in section]
    algorithm: dict[str, Any] = {}
    if builtin in section:
        if given:
            problems.append(f"{kind}: set {builtin} or {', '.join(custom)}, not both (NNI's v1 rule)")
        algorithm["name"] = section[builtin]
    elif len(given) < len(custom):
        problems.append(f"{kind}: set {builtin}, or {', '.join(custom)} together (NNI's v1 rule)")
    elif not isinstance(file_name := section["classFileName"], str) or not file_name.endswith(".py"):
        problems.append(f"{kind}.classFileName: must name a .py file in {kind}.codeDir, not {file_name!r}")
    elif not isinstance(section["className"], str) or not section["className"]:
        problems.append(f"{kind}.className: must name the class in {kind}.classFileName")
    else:
        algorithm["className"] = f"{file_name[:-3]}.{section['className']}"
        algorithm["codeDirectory"] = section["codeDir"]
    if section.get("gpuIndices") is not None:
        out["tunerGpuIndices"] = section["gpuIndices"]
    return {**algorithm, **args}
