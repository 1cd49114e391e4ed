"""The ``nni`` shim speaks NNI's trial protocol byte for byte (nni-protocols.md §1.2–1.5).

Like NNI, the shim reads its environment at import, so every test loads a fresh copy
of the module under the environment it sets.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.trial_keeper import SHIM_PATH

PARAMETERS = '{"parameter_id": 7, "parameter_source": "algorithm", "parameters": {"lr": 0.01}, "parameter_index": 0}'
NNI_ENV = ("NNI_PLATFORM", "NNI_SYS_DIR", "NNI_TRIAL_JOB_ID", "NNI_EXP_ID", "NNI_TRIAL_SEQ_ID", "REUSE_MODE")


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


def test_an_installed_nni_wins_over_the_shim(tmp_path: Path) -> None:
    """The shim is on PYTHONPATH first, yet a trial whose interpreter has NNI gets NNI."""
    real = tmp_path / "site" / "nni"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\nfrom nni import sub\n")
    (real / "sub.py").write_text("VALUE = 42\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SHIM_PATH), str(tmp_path / "site")])}
    out = subprocess.run(
        [sys.executable, "-c", "import nni; print(nni.__file__, nni.REAL, nni.sub.VALUE)"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()
    assert out == [str(real / "__init__.py"), "True", "42"]


def test_without_an_installed_nni_the_shim_is_used() -> None:
    env = {**os.environ, "PYTHONPATH": str(SHIM_PATH)}
    out = subprocess.run(
        [sys.executable, "-c", "import nni; print(nni.__file__)"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == str(SHIM_PATH / "nni" / "__init__.py")
