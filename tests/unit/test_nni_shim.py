"""The ``nni`` shim speaks NNI's trial protocol byte for byte (nni-protocols.md §1.2–1.5), serves
NNI's trial API even where the real package is installed, and hands the rest of ``nni`` to that
package, lazily.

The trial API's tests load a fresh copy of the module per test; the tests of what ``import nni``
gives a trial run a Python of their own, with the shim first on its ``PYTHONPATH`` as adapters put it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from services.trial_keeper import SHIM_PATH
from tests.fixtures.nni import nni_sdk

PARAMETERS = '{"parameter_id": 7, "parameter_source": "algorithm", "parameters": {"lr": 0.01}, "parameter_index": 0}'
NNI_ENV = ("NNI_PLATFORM", "NNI_SYS_DIR", "NNI_TRIAL_JOB_ID", "NNI_EXP_ID", "NNI_TRIAL_SEQ_ID", "REUSE_MODE")
#: What a trial's Python must not inherit from the test's (``python()`` below).
NNI_ALL = (*NNI_ENV, "NNI_OUTPUT_DIR", "MULTI_PHASE", "NNI_TRIAL_COMMAND_CHANNEL", "SDK_PROCESS")


@pytest.fixture
def load(monkeypatch, tmp_path: Path):
    """``load(platform, **env)`` → a fresh ``nni`` module for a trial in ``tmp_path``."""

    def load(platform: str | None = "local", parameters: str | None = PARAMETERS, **env: str):
        for name in NNI_ENV:
            monkeypatch.delenv(name, raising=False)
        if platform is not None:
            monkeypatch.setenv("NNI_PLATFORM", platform)
            monkeypatch.setenv("NNI_SYS_DIR", str(tmp_path))
            monkeypatch.setenv("NNI_TRIAL_JOB_ID", "Ab3dE")
            monkeypatch.setenv("NNI_EXP_ID", "k3x9a2bq")
            monkeypatch.setenv("NNI_TRIAL_SEQ_ID", "4")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        if parameters is not None:
            (tmp_path / "parameter.cfg").write_text(parameters)
        spec = importlib.util.spec_from_file_location("nni_under_test", SHIM_PATH / "nni" / "__init__.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


def frames(trial_dir: Path) -> list[dict]:
    data = (trial_dir / ".nni" / "metrics").read_bytes()
    records = []
    while data:
        assert data[:2] == b"ME"
        size = int(data[2:8])
        body, data = data[8 : 8 + size], data[8 + size :]
        assert body.endswith(b"\n")
        records.append(json.loads(body))
    return records


def test_parameters_come_from_parameter_cfg_once(load):
    nni = load()
    assert nni.get_next_parameter() == {"lr": 0.01}
    assert nni.get_current_parameter() == {"lr": 0.01}
    assert nni.get_current_parameter("lr") == 0.01
    # Without MULTI_PHASE a second call gets nothing, as in NNI.
    assert nni.get_next_parameter() is None
    assert (nni.get_experiment_id(), nni.get_trial_id(), nni.get_sequence_id()) == ("k3x9a2bq", "Ab3dE", 4)


def test_local_platform_writes_nni_frames_byte_for_byte(load, tmp_path):
    nni = load()
    nni.get_next_parameter()
    nni.report_intermediate_result(0.5)
    expected = b'{"parameter_id": 7, "trial_job_id": "Ab3dE", "type": "PERIODICAL", "sequence": 0, "value": "0.5"}\n'
    assert (tmp_path / ".nni" / "metrics").read_bytes() == b"ME000098" + expected


def test_sequences_count_per_process_and_values_are_double_encoded(load, tmp_path):
    nni = load()
    nni.get_next_parameter()
    nni.report_intermediate_result(1)
    nni.report_intermediate_result({"default": 0.25, "loss": float("nan")})
    nni.report_final_result({"default": 0.9})
    records = frames(tmp_path)
    assert [(r["type"], r["sequence"]) for r in records] == [("PERIODICAL", 0), ("PERIODICAL", 1), ("FINAL", 0)]
    assert [r["value"] for r in records] == ["1", '{"default": 0.25, "loss": NaN}', '{"default": 0.9}']
    assert math.isnan(json.loads(records[1]["value"])["loss"])
    assert {r["parameter_id"] for r in records} == {7}


@pytest.mark.parametrize(("platform", "env"), [("remote", {}), ("pai", {}), ("local", {"REUSE_MODE": "true"})])
def test_other_platforms_print_nnisdk_lines(load, tmp_path, capsys, platform, env):
    nni = load(platform, **env)
    nni.get_next_parameter()
    nni.report_final_result(0.75)
    out = capsys.readouterr().out
    record = '{"parameter_id": 7, "trial_job_id": "Ab3dE", "type": "FINAL", "sequence": 0, "value": "0.75"}'
    assert out == f"NNISDK_MEb'{record}'\n"
    assert not (tmp_path / ".nni" / "metrics").exists()


def test_scalars_with_item_are_reported_as_numbers(load, tmp_path):
    class Float32:  # what numpy and torch scalars look like to the SDK
        def item(self):
            return 0.125

    nni = load()
    nni.get_next_parameter()
    nni.report_final_result({"default": Float32(), "history": [Float32()]})
    assert frames(tmp_path)[0]["value"] == '{"default": 0.125, "history": [0.125]}'


def test_reporting_before_getting_parameters_is_an_error(load):
    nni = load()
    with pytest.raises(AssertionError, match="get_next_parameter"):
        nni.report_final_result(1.0)


def test_a_missing_parameter_file_is_requested_then_awaited(load, tmp_path, monkeypatch):
    nni = load(parameters=None)
    waits = []

    def sleep(seconds):  # the file shows up while the SDK waits, as when the keeper writes it
        waits.append(seconds)
        (tmp_path / "parameter.cfg").write_text(PARAMETERS)

    monkeypatch.setattr(nni.time, "sleep", sleep)
    assert nni.get_next_parameter() == {"lr": 0.01}
    assert waits == [3]
    assert frames(tmp_path) == [
        {"trial_job_id": "Ab3dE", "type": "REQUEST_PARAMETER", "sequence": 0, "parameter_index": 0}
    ]


def test_multi_phase_reads_the_next_parameter_file_on_each_call(load, tmp_path):
    nni = load(MULTI_PHASE="true")
    (tmp_path / "parameter_1.cfg").write_text(PARAMETERS.replace("0.01", "0.02").replace("7", "8"))
    assert [nni.get_next_parameter(), nni.get_next_parameter()] == [{"lr": 0.01}, {"lr": 0.02}]
    nni.report_final_result(1)
    assert frames(tmp_path)[0]["parameter_id"] == 8


def test_standalone_without_nni_platform(load, capsys):
    nni = load(platform=None, parameters=None)
    assert nni.get_next_parameter() == {}
    assert (nni.get_experiment_id(), nni.get_trial_id(), nni.get_sequence_id()) == ("STANDALONE", "STANDALONE", 0)
    nni.report_intermediate_result(0.5)
    nni.report_final_result(0.9)
    out = capsys.readouterr().out
    assert "Intermediate result: 0.5  (Index 0)" in out
    assert "Final result: 0.9" in out
    assert "NNISDK" not in out


def python(code: str, *path: Path, cwd: Path | None = None, **env: str) -> list:
    """Run ``code`` in a Python of its own with ``path`` as its PYTHONPATH and no NNI variables but
    ``env``; its last line of output, as JSON."""
    clean = {name: value for name, value in os.environ.items() if name not in NNI_ALL}
    clean.update(env, PYTHONPATH=os.pathsep.join(map(str, path)))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=clean, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def trial_env(trial_dir: Path, platform: str = "local") -> dict[str, str]:
    (trial_dir / "parameter.cfg").write_text(PARAMETERS)
    return {
        "NNI_PLATFORM": platform,
        "NNI_SYS_DIR": str(trial_dir),
        "NNI_OUTPUT_DIR": str(trial_dir),
        "NNI_TRIAL_JOB_ID": "Ab3dE",
        "NNI_EXP_ID": "k3x9a2bq",
        "NNI_TRIAL_SEQ_ID": "4",
    }


def test_a_trial_forked_from_a_template_reads_its_own_environment(tmp_path: Path) -> None:
    # Given: a template process that imported nni before any trial's environment existed
    code = """
        import json, os, nni
        answer, answer_w = os.pipe()
        if os.fork() == 0:  # When: the trial it forks gets its environment, then calls the trial API
            os.environ.update(json.loads(os.environ["TRIAL_ENV"]))
            nni.get_next_parameter()
            nni.report_final_result(0.5)
            ids = [nni.get_experiment_id(), nni.get_trial_id(), nni.get_sequence_id()]
            os.write(answer_w, json.dumps(ids).encode())
            os._exit(0)
        os.close(answer_w)
        trial = json.loads(os.read(answer, 1000))
        print(json.dumps([trial, [nni.get_trial_id(), nni.get_sequence_id()]]))  # the template's own ids after
    """
    trial, template = python(code, SHIM_PATH, TRIAL_ENV=json.dumps(trial_env(tmp_path)))
    # Then: the trial's records and ids are its own, and the template stays standalone
    assert trial == ["k3x9a2bq", "Ab3dE", 4]
    assert [(r["trial_job_id"], r["parameter_id"], r["value"]) for r in frames(tmp_path)] == [("Ab3dE", 7, "0.5")]
    assert template == ["STANDALONE", 0]


def test_without_an_installed_nni_the_shim_is_used() -> None:
    code = """
        import json, nni
        try:
            nni.trace
        except AttributeError as exc:
            error = str(exc)
        try:
            import nni.experiment
        except ModuleNotFoundError as exc:
            missing = exc.name
        print(json.dumps([nni.__file__, nni.__version__, error, missing, hasattr(nni, "__wrapped__")]))
    """
    where, version, error, missing, wrapped = python(code, SHIM_PATH)
    assert where == str(SHIM_PATH / "nni" / "__init__.py")
    assert version == "0.1.0"
    assert error.startswith("nni.trace needs the nni package: pip install nni")
    assert (missing, wrapped) == ("nni.experiment", False)


@pytest.fixture
def fake_nni(tmp_path: Path) -> Path:
    """A tiny installed ``nni`` whose submodules need its ``__init__`` to have run, as NNI's do."""
    site = tmp_path / "site"
    (site / "nni").mkdir(parents=True)
    (site / "nni" / "__init__.py").write_text(
        "from .version import __version__\nfrom .serializer import trace\nfrom .experiment import Experiment\n"
        "def get_next_parameter():\n    return 'the real one'\n"
    )
    (site / "nni" / "version.py").write_text("__version__ = '9.9'\n")
    (site / "nni" / "serializer.py").write_text("def trace(cls):\n    cls.traced = True\n    return cls\n")
    (site / "nni" / "experiment.py").write_text("import nni\n\n@nni.trace\nclass Experiment:\n    pass\n")
    (site / "nni" / "tools.py").write_text("from nni import Experiment\n")
    return site


def test_an_installed_nni_backs_what_the_trial_api_lacks(fake_nni: Path) -> None:
    # Given: the shim first on the path, an installed nni after it
    # When: a real submodule is the first thing imported, then the rest of nni is used
    code = """
        import json, sys
        from nni.experiment import Experiment
        import nni, nni.tools
        print(json.dumps([nni.__file__, nni.get_next_parameter.__module__, Experiment.traced,
                          Experiment is nni.Experiment is nni.tools.Experiment, nni.__version__, nni.__path__]))
    """
    where, api, traced, same, version, path = python(code, SHIM_PATH, fake_nni)
    # Then: `import nni` is the shim, whose trial API is its own; the rest is the installed package's,
    # its __init__ run before its submodules (experiment.py's @nni.trace worked) and once (one Experiment)
    assert (where, api) == (str(SHIM_PATH / "nni" / "__init__.py"), "nni")
    assert traced is True and same is True
    assert version == "9.9"
    assert path == [str(fake_nni / "nni"), str(SHIM_PATH / "nni")]


def test_the_installed_version_is_read_without_loading_the_package(fake_nni: Path) -> None:
    code = """
        import json, sys, nni
        version, loaded = nni.__version__, "nni.serializer" in sys.modules
        print(json.dumps([version, loaded, nni.trace.__module__, "nni.serializer" in sys.modules]))
    """
    assert python(code, SHIM_PATH, fake_nni) == ["9.9", False, "nni.serializer", True]


# -- with NNI 3.0 itself installed after the shim -----------------------------------------------------


def test_with_nni_installed_the_trial_api_is_the_shim_s_and_cheap(tmp_path: Path) -> None:
    # Given: the real nni package installed, the shim first on the path
    sdk = nni_sdk()
    # When: a trial uses the whole trial API, and asks for nni's version
    code = """
        import json, sys, nni
        params = nni.get_next_parameters()
        nni.report_intermediate_result(0.5)
        nni.report_final_result({"default": 0.9})
        answers = [params, nni.get_current_parameter("lr"), nni.get_experiment_id(), nni.get_trial_id(),
                   nni.get_sequence_id(), nni.__version__]
        print(json.dumps([answers, nni.__file__, sorted(m for m in sys.modules if m.startswith("nni"))]))
    """
    answers, where, modules = python(code, SHIM_PATH, sdk, **trial_env(tmp_path))
    # Then: the shim answered and wrote NNI's frames, the version is the installed one, and
    # nothing of the real package was imported
    installed = python("import importlib.metadata as m, json; print(json.dumps(m.version('nni')))", sdk)
    assert answers == [{"lr": 0.01}, 0.01, "k3x9a2bq", "Ab3dE", 4, installed]
    assert where == str(SHIM_PATH / "nni" / "__init__.py")
    assert [(r["type"], r["sequence"], r["value"]) for r in frames(tmp_path)] == [
        ("PERIODICAL", 0, "0.5"),
        ("FINAL", 0, '{"default": 0.9}'),
    ]
    assert modules == ["nni", "nni._trialbus_handover"]  # the handover module read the version: no nni.runtime


@pytest.mark.parametrize(
    "first",
    [
        "import nni; nni.trace",
        "from nni import trace",
        "from nni.experiment import Experiment",
        "import nni.nas",
        "import nni.runtime.env_vars",
        "from nni.runtime.msg_dispatcher import MsgDispatcher",  # it does `from nni import NoMoreTrialError`
        "from nni.algorithms.hpo.tpe_tuner import TpeTuner",  # `from nni import ClassArgsValidator`
        "import nni.trial",
    ],
)
def test_the_rest_of_nni_is_the_installed_package(first: str) -> None:
    # Given: the real nni package installed, the shim first on the path
    sdk = nni_sdk()
    # When: a process starts with `first`, then looks at nni
    code = f"""
        import json, sys
        {first}
        import nni, nni.experiment, nni.trial
        from nni.runtime.trial_command_channel import get_default_trial_command_channel as channel
        print(json.dumps([nni.__file__, nni.get_next_parameter is nni.trial.get_next_parameter,
                          nni.trace.__module__, nni.Experiment is nni.experiment.Experiment,
                          nni.__path__[0], type(channel()).__name__]))
    """
    where, same_api, trace, same_experiment, path, channel = python(code, SHIM_PATH, sdk)
    # Then: `nni` is still the shim, serving the trial API itself; the rest is the real package's,
    # loaded once, whose default trial command channel is the shim's
    assert where == str(SHIM_PATH / "nni" / "__init__.py") and same_api is False
    assert (trace, same_experiment, path) == ("nni.common.serializer", True, str(sdk / "nni"))
    assert channel == "TrialbusTrialCommandChannel"


def test_the_trial_state_moves_into_nni_trial_when_the_package_loads(tmp_path: Path) -> None:
    # Given: a trial that got its parameters and reported once through the shim
    sdk = nni_sdk()
    code = """
        import json, sys, nni
        params = nni.get_next_parameter()
        nni.report_intermediate_result(0.1)
        # When: the real package loads, and NNI code uses nni.trial and swaps the trial command channel
        import nni.trial
        from nni.runtime.trial_command_channel import TrialCommandChannel, set_default_trial_command_channel
        seen = [nni.trial.get_current_parameter(), nni.trial.get_trial_id(), nni.trial.get_sequence_id()]
        nni.trial.report_intermediate_result(0.2)
        nni.report_intermediate_result(0.3)

        class Recorder(TrialCommandChannel):  # what NAS's sequential engine does
            def send_metric(self, **metric):
                seen.append([metric["type"], metric["sequence"], metric["value"]])

        original = nni.runtime.trial_command_channel.get_default_trial_command_channel()
        set_default_trial_command_channel(Recorder())
        nni.report_intermediate_result(0.4)
        set_default_trial_command_channel(original)
        nni.report_final_result(0.5)
        # (NNI sends a local trial's stdout to $NNI_OUTPUT_DIR/trial.log when it loads, as it always has)
        print(json.dumps([params, seen, nni.get_current_parameter()]), file=sys.__stdout__)
    """
    params, seen, current = python(code, SHIM_PATH, sdk, cwd=tmp_path, **trial_env(tmp_path))
    # Then: NNI's nni.trial sees the shim's parameters and ids; the sequence goes on across both APIs;
    # a swapped channel gets the shim's reports; and every record went out as the shim writes it
    assert params == current == {"lr": 0.01}
    assert seen == [{"lr": 0.01}, "Ab3dE", 4, ["PERIODICAL", 3, 0.4]]
    assert [(r["type"], r["sequence"], r["value"], r["parameter_id"]) for r in frames(tmp_path)] == [
        ("PERIODICAL", 0, "0.1", 7),
        ("PERIODICAL", 1, "0.2", 7),
        ("PERIODICAL", 2, "0.3", 7),
        ("FINAL", 0, "0.5", 7),
    ]
