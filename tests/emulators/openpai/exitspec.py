"""The part of OpenPAI's exit spec (``k8s-job-exit-spec.yaml``) that the emulator can produce.

Two jobs, both done upstream by separate components:

* ``classify`` stands in for openpai-runtime's exit handler: it turns a user command's exit
  status plus its log into the container exit code, by the spec's ``runtimeContainerPatterns``
  in file order, defaulting to 255 (PAIRuntimeUnknownFailed). So ``exit 1`` gives 255, a
  ``command not found`` (127) gives 220, and a death by SIGKILL gives 137.
* ``record`` is the rest-server's ``generateExitSpec``: the whole record for a code, with
  unknown codes mapped to record 256 (positive) or -8000 (negative) and ``code`` overwritten.

Records are transcribed from microsoft/pai ``src/k8s-job-exit-spec/config/k8s-job-exit-spec.yaml``
(without their ``pattern`` field); codes that need hardware or Kubernetes (ECC, image pulls,
...) have records but are never produced here, except the ones a test asks for with
``Runner.fail``: a task whose pod is deleted (−101), evicted (−1000), lost with its node (−1001)
or preempted by its kubelet (−1003).
"""

from __future__ import annotations

import re
from typing import Any

RETRY_ALWAYS = "ALWAYS_RETRY"
RETRY_BACKOFF = "ALWAYS_BACKOFF_RETRY"
RETRY_TO_MAX = "RETRY_TO_MAX"
RETRY_NEVER = "NEVER_RETRY"

STOP_REQUESTED = -210  # StopFrameworkRequested: the user stopped the job
ATTEMPT_COMPLETION = -220  # FrameworkAttemptCompletion: a task stopped because its attempt completed
RUNTIME_UNKNOWN = 255  # the runtime's default when no pattern matches
POD_EXTERNAL_DELETED = -101
NODE_LOST = -1001
#: The pod's ``status.reason`` behind each Kubernetes code (the spec's ``controllerPodPatterns``).
POD_REASONS = {-1000: "Evicted", -1001: "NodeLost", -1003: "Preempting"}


#: A record's fields after its phrase, that records of one kind share: the kinds below.
_KIND_FIELDS = ("issuer", "causer", "type", "stage", "behavior", "reaction")

_SUCCESS = ("USER_CONTAINER", "USER_CONTAINER", "USER_SUCCESS", "COMPLETING", "UNKNOWN", RETRY_NEVER)
_FC_LOST = ("PAI_FC", "PAI_UNKNOWN", "PLATFORM_FAILURE", "UNKNOWN", "TRANSIENT", RETRY_ALWAYS)
_STOP = ("PAI_FC", "USER_STOP", "USER_STOP", "UNKNOWN", "PERMANENT", RETRY_NEVER)
_K8S = ("PAI_K8S", "PAI_K8S", "PLATFORM_FAILURE", "RUNNING", "TRANSIENT", RETRY_ALWAYS)
_OS = ("PAI_OS", "PAI_OS", "PLATFORM_FAILURE", "RUNNING", "TRANSIENT", RETRY_ALWAYS)
_BUG = ("USER_CONTAINER", "USER_CONTAINER", "USER_FAILURE", "RUNNING", "PERMANENT", RETRY_NEVER)
_CRASH = ("USER_CONTAINER", "UNKNOWN", "UNKNOWN_FAILURE", "RUNNING", "UNKNOWN", RETRY_TO_MAX)
_RUNTIME_BUG = ("PAI_RUNTIME", "USER_CONTAINER", "USER_FAILURE", "RUNNING", "PERMANENT", RETRY_NEVER)

_WAIT = ["Wait result from next retry", "Contact Cluster Admin"]
_FIX = ["Check container log and fix your program bug"]
_CORRECT = ["Check the source code and correct it"]
_FIND_CAUSE = ["Check container log and find root cause", "Wait result from next retry"]
_LESS_MEMORY = ["Increase per task memory request", "Decrease per task memory usage by such as increasing task number"]


def _record(code, phrase, kind, reason, repro, solution) -> dict[str, Any]:
    """The spec's record, its fields in the spec's order, without those it leaves out (None)."""
    rec = {"code": code, "phrase": phrase, **dict(zip(_KIND_FIELDS, kind, strict=True))}
    rec |= {"reason": reason, "repro": [repro], "solution": solution}
    return {k: v for k, v in rec.items() if v is not None}


#: A death by signal: (128 + its number, its name, kind, solution, repro; None: the OS killed it).
_SIGNALS = [
    (130, "Int", _OS, _WAIT, None),
    (131, "Quit", _OS, _WAIT, None),
    (132, "Ill", _BUG, _FIX, "User program executes an illegal, malformed, unknown, or privileged machine instruction"),
    (134, "Abrt", _CRASH, _FIND_CAUSE, "User program calls abort() by libc"),
    (135, "Bus", _BUG, _FIX, "User program accesses an unaligned memory address"),
    (136, "Fpe", _BUG, _FIX, "User program division by zero"),
    (137, "Kill", _OS, _WAIT, None),
    (139, "Segv", _CRASH, [*_FIX, "Contact Cluster Admin"], "User program accesses an illegal memory address"),
    (141, "Pipe", _BUG, _FIX, "User program writes to a pipe without a process connected to the other end"),
    (143, "Term", _OS, _WAIT, None),
]


def _signal(code, name, kind, solution, repro) -> dict[str, Any]:
    """The record of a death by signal ``SIG<name>``, a row of :data:`_SIGNALS`."""
    sig = f"SIG{name.upper()}"
    repro = repro or f"Kill container process by {sig}"
    return _record(code, f"ContainerSig{name}Received", kind, f"Container killed by OS Signal: {sig}", repro, solution)


_RECORDS = [
    _record(0, "Succeeded", _SUCCESS, None, "User program exits with exitcode 0", None),
    _record(
        -100,
        "ConfigMapExternalDeleted",
        _FC_LOST,
        "The ConfigMap of this job attempt is deleted by external unexpectedly",
        "Manually delete the ConfigMap of this job attempt",
        _WAIT,
    ),
    _record(
        -101,
        "PodExternalDeleted",
        _FC_LOST,
        "Pod is deleted by external unexpectedly",
        "Manually delete a Pod of this job",
        _WAIT,
    ),
    _record(
        -200,
        "PodCreationPermanentError",
        ("PAI_FC", "USER_SUBMISSION", "USER_FAILURE", "SUBMITTING", "PERMANENT", RETRY_NEVER),
        "Failed to create Pod due to permanent error, maybe the Pod spec is invalid",
        "Specify a Pod in Framework with duplicated container names",
        ["Check diagnostics and revise your job config"],
    ),
    _record(-210, "StopFrameworkRequested", _STOP, "User has requested to stop the job", "Stop a job", None),
    _record(
        -220,
        "FrameworkAttemptCompletion",
        _STOP,
        "Stop to complete current job attempt",
        "Stop a job with long running container",
        None,
    ),
    _record(
        -230,
        "DeleteTaskRequested",
        ("PAI_FC", "USER_SCALEDOWN", "USER_STOP", "UNKNOWN", "PERMANENT", RETRY_NEVER),
        "User has requested to delete the Task by Job ScaleDown",
        "ScaleDown a job with long running container",
        None,
    ),
    _record(
        -1000,
        "PodEvicted",
        _K8S,
        "Pod is evicted by K8S, maybe its node is out of resource",
        "Start a raw process on the host to use up almost all memory on the node",
        _WAIT,
    ),
    _record(
        -1001,
        "PodNodeLost",
        _K8S,
        "Pod lost due to node lost, maybe its kubelet is down for a long time",
        "Stop the Pod's kubelet",
        _WAIT,
    ),
    _record(
        -1003,
        "PodPreemptedForCriticalPod",
        _K8S,
        "Pod is preempted by the kubelet of its node for the admission of other more critical platform Pod",
        "Submit a large critical Pod to a node with a normal Pod already running",
        _WAIT,
    ),
    _record(
        -1100,
        "CreateFrameworkPermanentFailed",
        ("PAI_DB_CONTROLLER", "USER_SUBMISSION", "USER_FAILURE", "SUBMITTING", "PERMANENT", RETRY_NEVER),
        "Job is submitted to database, but cannot be created in ApiServer due to permanent failures",
        "Submit a job with a very large job config",
        ["Check job events and fix your job config"],
    ),
    _record(
        -1200,
        "UserContainerDockerOOMKilled",
        ("PAI_DOCKER", "USER_CONTAINER", "USER_FAILURE", "RUNNING", "PERMANENT", RETRY_NEVER),
        "User Container killed by docker due to it exceeded the request memory",
        "User program uses more memory than its requested",
        _LESS_MEMORY,
    ),
    _record(
        128,
        "ContainerMayFailDueToGpuDeviceEccError",
        ("USER_CONTAINER", "PAI_HW", "PLATFORM_FAILURE", "RUNNING", "UNKNOWN", RETRY_TO_MAX),
        "Container failed may due to GPU ecc error",
        "Run program in GPU with ECC error",
        _WAIT,
    ),
    *(_signal(*row) for row in _SIGNALS),
    _record(
        220,
        "UserCommandExitWithError",
        _BUG,
        "User command is invalid",
        "Start a job with invalid command",
        ["Check the user command", "Check the PATH environment variable in the container"],
    ),
    _record(
        221,
        "ContainerTensorflowOOMKilled",
        _RUNTIME_BUG,
        "Tensorflow failed due to out of memory",
        "Tensorflow uses more memory than it is allocated",
        [*_LESS_MEMORY, "Tuning the tensorflow program"],
    ),
    _record(
        223,
        "ContainerCudaUncorrectableECCError",
        ("PAI_RUNTIME", "PAI_HW", "PLATFORM_FAILURE", "RUNNING", "TRANSIENT", RETRY_ALWAYS),
        "Container failed due to GPU uncorrectable ECC error",
        "Run tensorflow on a GPU which has ECC error",
        _WAIT,
    ),
    _record(
        226,
        "ContainerCudaOOMKilled",
        _RUNTIME_BUG,
        "Container failed due to out of gpu memory",
        "Allocate GPU memory exceed hardware limit",
        ["Select GPU type which has more physical memory", "Tuning the program parameter to use less memory"],
    ),
    _record(
        231,
        "ContainerSyntaxError",
        _RUNTIME_BUG,
        "Container failed due to syntax error",
        "User use invalid syntax in code",
        ["Check the source code and correct the errors"],
    ),
    _record(
        232,
        "ContainerImportError",
        _RUNTIME_BUG,
        "Container failed due to error import",
        "User import invalid module",
        _CORRECT,
    ),
    _record(
        233,
        "ContainerIndexOutOfRange",
        _RUNTIME_BUG,
        "User code access element which out of range",
        "Access element out of range",
        _CORRECT,
    ),
    _record(
        234,
        "ContainerSigvFault",
        _RUNTIME_BUG,
        "Container failed due to segmentation fault",
        "Access invalid memory address",
        ["Correct the user code"],
    ),
    _record(
        235,
        "ContainerEngineCoreDump",
        _RUNTIME_BUG,
        "Container failed due to engine core dump",
        "Access invalid memory address",
        ["Correct the user code"],
    ),
    _record(
        251,
        "JobGangAllocationTimeout",
        (
            "PAI_RUNTIME",
            "RESOURCE_ALLOCATION_TIMEOUT",
            "RESOURCE_ALLOCATION_TIMEOUT",
            "ALLOCATING",
            "TRANSIENT_CONFLICT",
            RETRY_BACKOFF,
        ),
        "All requested resources of all tasks in the job cannot be satisfied in time",
        "Request more containers in a guaranteed job than its virtual cluster current available",
        [
            "Wait result from next retry",
            "Decrease task number",
            "Decrease per task resource request",
            "Contact Cluster Admin to increase your virtual cluster quota",
        ],
    ),
    _record(
        254,
        "ContainerImageNotExists",
        ("PAI_RUNTIME", "PAI_RUNTIME", "USER_FAILURE", "LAUNCHING", "PERMANENT", RETRY_NEVER),
        "Pull access denied, repository does not exist or may require authentication",
        "Submit job with incorrect docker image uri",
        ["Correct docker image uri in job protocol"],
    ),
    _record(
        255,
        "PAIRuntimeUnknownFailed",
        ("PAI_RUNTIME", "UNKNOWN", "UNKNOWN_FAILURE", "UNKNOWN", "UNKNOWN", RETRY_TO_MAX),
        "User command failed but the failure cannot be recognized by PAI Runtime",
        "User program directly exits with exitcode 1",
        _FIND_CAUSE,
    ),
    _record(
        256,
        "PAIRuntimeExitAbnormally",
        ("PAI_RUNTIME", "PAI_RUNTIME", "PLATFORM_FAILURE", "UNKNOWN", "UNKNOWN", RETRY_TO_MAX),
        "PAI Runtime exit abnormally with undefined exitcode, it may have bugs",
        "PAI Runtime exits with exitcode 1",
        ["Contact PAI Dev to fix PAI Runtime bugs"],
    ),
    _record(
        -8000,
        "ContainerUndefinedNegativeExitCode",
        ("UNKNOWN", "UNKNOWN", "UNKNOWN_FAILURE", "UNKNOWN", "UNKNOWN", RETRY_TO_MAX),
        "Container exited with undefined negative exitcode",
        "Remove code -100 in the spec, then repro -100",
        ["Contact PAI Dev to recognize this exitcode"],
    ),
]
EXIT_SPEC: dict[int, dict[str, Any]] = {r["code"]: r for r in _RECORDS}

# runtimeContainerPatterns in spec file order: (container exit code, user exit code or None, user-log regex or None)
_PATTERNS: list[tuple[int, int | None, str | None]] = [
    *((code, code, None) for code, *_ in _SIGNALS),  # a death by signal keeps its code
    (220, 127, r"(?i)command not found"),
    (221, None, r"(?mi)tensorflow.*ResourceExhaustedError.*OOM.*"),
    (221, None, r"(?i)ran out of memory trying to allocate"),
    (223, None, r"(?mi)CUDA_ERROR_ECC_UNCORRECTABLE.*"),
    (226, None, r"(?i)cuda runtime error (2) : out of memory"),
    (231, None, r"(?i)syntaxerror: invalid syntax"),
    (231, None, r"(?mi)attributeerror:.*has no attribute"),
    (231, None, r"(?mi)nameerror: name.* is not defined"),
    (232, None, r"(?mi)importerror:.*"),
    (233, None, r"(?mi)indexerror:.*index out of range"),
    (234, None, r"(?i)segmentation fault"),
    (235, None, r"(?i)core dumped"),
]


def record(code: int | None) -> dict[str, Any] | None:
    """The rest-server's ``appExitSpec`` for a completion code (None for None)."""
    if code is None:
        return None
    if code in EXIT_SPEC:
        return dict(EXIT_SPEC[code])
    return {**EXIT_SPEC[256 if code > 0 else -8000], "code": code}


def reaction(code: int) -> str:
    return record(code)["reaction"]  # type: ignore[index]


def classify(user_exit: int, user_log: str) -> tuple[int, str | None]:
    """Container exit code for a user command's exit status, and the log text a pattern matched."""
    if user_exit == 0:
        return 0, None
    for code, exit_code, regex in _PATTERNS:
        if exit_code is not None and exit_code != user_exit:
            continue
        if regex is None:
            return code, None
        match = re.search(regex, user_log)
        if match:
            return code, match.group(0)
    return RUNTIME_UNKNOWN, None
