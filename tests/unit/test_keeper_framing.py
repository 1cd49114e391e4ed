"""The keeper's pure functions: NNI's ME frames, NNISDK stdout lines, hand-written JSON, URLs.

The keeper is a script shipped to trial hosts, not a package module, so the tests load
the file itself, the way it runs.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import trialbus
from services.trial_keeper import KEEPER_PATH, SHIM_PATH


def load_keeper():
    spec = importlib.util.spec_from_file_location("trial_keeper_under_test", KEEPER_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


keeper = load_keeper()

# The record of NNI's reference (nni-protocols.md §1.4), as the SDK frames it.
RECORD = '{"parameter_id": 7, "trial_job_id": "Ab3dE", "type": "PERIODICAL", "sequence": 0, "value": "0.5"}'
FRAME = b"ME000098" + RECORD.encode() + b"\n"


def test_keeper_version_is_the_release_version():
    assert trialbus.__version__ == keeper.VERSION


def test_paths_point_at_the_shipped_files():
    assert KEEPER_PATH.name == "trial_keeper.py" and KEEPER_PATH.is_file()
    assert (SHIM_PATH / "nni" / "__init__.py").is_file()


def test_version_flag_prints_the_version():
    done = subprocess.run([sys.executable, "-S", "-I", str(KEEPER_PATH), "--version"], capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stdout.strip() == trialbus.__version__


def test_missing_configuration_exits_2_with_a_message():
    done = subprocess.run([sys.executable, "-S", "-I", str(KEEPER_PATH)], capture_output=True, text=True, env={})
    assert done.returncode == 2
    assert "TRIALBUS_TRIAL_DIR" in done.stderr


# -- ME frames (.nni/metrics) --------------------------------------------------------------


def test_frame_length_counts_the_newline():
    assert keeper.frame(RECORD) == FRAME


def test_frames_are_split_into_records():
    records, rest = keeper.parse_frames(FRAME + keeper.frame('{"a": "é"}') + FRAME)
    assert records == [RECORD, '{"a": "é"}', RECORD]
    assert rest == b""


@pytest.mark.parametrize("cut", range(len(FRAME) + 1))
def test_a_partial_frame_waits_for_the_rest(cut):
    # Given a frame that arrives in two reads, cut anywhere
    records, rest = keeper.parse_frames(FRAME[:cut])
    # then nothing is emitted before the frame is whole
    assert records == ([RECORD] if cut == len(FRAME) else [])
    # and the rest completes it with the next read
    more, rest = keeper.parse_frames(rest + FRAME[cut:])
    assert records + more == [RECORD]
    assert rest == b""


def test_bytes_that_are_not_a_frame_are_skipped():
    records, rest = keeper.parse_frames(b"garbage" + FRAME + b"MEabcdefXX" + FRAME + b"M")
    assert records == [RECORD, RECORD]
    assert rest == b"M"  # might be the start of the next frame


RECORD_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1)


@given(st.lists(RECORD_TEXT, max_size=5), st.integers(min_value=1, max_value=64))
def test_any_records_survive_any_read_sizes(texts, read_size):
    stream = b"".join(keeper.frame(t) for t in texts)
    got, rest = [], b""
    for i in range(0, len(stream), read_size):
        records, rest = keeper.parse_frames(rest + stream[i : i + read_size])
        got += records
    assert rest == b""
    assert got == texts


# -- NNISDK_MEb'…' lines (stdout channel) --------------------------------------------------


def test_metric_lines_are_extracted_and_other_lines_ignored():
    out = f"epoch 1\nNNISDK_MEb'{RECORD}'\nloss 0.3\n".encode()
    assert keeper.extract_records(out) == ([RECORD], b"")


def test_a_partial_line_is_kept_for_the_next_read():
    line = f"NNISDK_MEb'{RECORD}'\n".encode()
    records, rest = keeper.extract_records(b"hello\n" + line[:20])
    assert (records, rest) == ([], line[:20])
    assert keeper.extract_records(rest + line[20:]) == ([RECORD], b"")


def test_lines_as_nni_matches_them():
    # A prefix before the marker and CRLF endings are fine; the record runs to the last quote.
    quoted = '{"trial_job_id": "x", "value": "\\"it\'s\\""}'
    out = f"[log] NNISDK_MEb'{RECORD}'\r\nNNISDK_MEb'{quoted}'\n".encode()
    assert keeper.extract_records(out)[0] == [RECORD, quoted]
    # Without the closing quote at the end of the line, or empty, it is no record.
    assert keeper.extract_records(f"NNISDK_MEb'{RECORD}' trailing\nNNISDK_MEb''\n".encode())[0] == []


def test_an_endless_line_is_not_buffered_forever():
    records, rest = keeper.extract_records(b"x" * (keeper.MAX_LINE + 1))
    assert (records, rest) == ([], b"")


# -- JSON by hand ----------------------------------------------------------------------------


@given(st.text())
def test_json_string_is_what_json_reads_back(text):
    assert json.loads(keeper.json_string(text)) == text


def test_control_characters_and_quotes_are_escaped():
    assert keeper.json_string('a"b\\c\n\t\x01') == '"a\\"b\\\\c\\n\\t\\u0001"'


def test_state_is_valid_json():
    state = {
        "keeperPid": 12,
        "startTime": 1700000000.25,
        "exitCode": -9,
        "done": True,
        "canceled": False,
        "error": 'gateway said "no"\n',
        "metricsFlushed": None,
    }
    assert json.loads(keeper.json_object(state)) == state


# -- the gateway URL -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host", "port", "path"),
    [
        ("http://127.0.0.1:8081", "127.0.0.1", 8081, "/api/v1/trials/T1/metrics"),
        ("http://gateway/", "gateway", 80, "/api/v1/trials/T1/metrics"),
        ("https://gw.example.com/trialbus", "gw.example.com", 443, "/trialbus/api/v1/trials/T1/metrics"),
        ("http://[::1]:9000", "::1", 9000, "/api/v1/trials/T1/metrics"),
        ("http://[::1]", "::1", 80, "/api/v1/trials/T1/metrics"),
    ],
)
def test_gateway_url(url, host, port, path):
    gateway = keeper.Gateway(url, "exp", "T1", "tok")
    assert (gateway.host, gateway.port) == (host, port)
    assert gateway.head.startswith(f"POST {path} HTTP/1.1\r\n")
    assert "Authorization: Bearer tok\r\n" in gateway.head
    assert f"X-Trialbus-Keeper-Version: {trialbus.__version__}\r\n" in gateway.head


def test_request_body_is_the_documented_json():
    gateway = keeper.Gateway("http://127.0.0.1:1", 'e"x', "T1", "tok", attempt=2)
    body = gateway.body_start + ", ".join(map(keeper.json_string, [RECORD, "x"])) + "]}"
    assert json.loads(body) == {"experimentId": 'e"x', "attempt": 2, "records": [RECORD, "x"]}


def test_an_unreachable_gateway_is_status_0():
    status, message = keeper.Gateway("http://127.0.0.1:1", "e", "t", "k").post([])
    assert status == 0
    assert "cannot reach" in message


def test_keepers_making_the_same_directories_at_once_all_succeed(tmp_path):
    """Trials launched together make their checkpoint directories under one new parent:
    one keeper making it first must not fail the others (before the fix, 120 of 400 calls failed)."""
    import threading

    def make(barrier: threading.Barrier, errors: list, path: str) -> None:
        barrier.wait()
        try:
            keeper.mkdir(path)
        except OSError as exc:
            errors.append(exc)

    for run in range(30):
        barrier, errors = threading.Barrier(8), []
        paths = [f"{tmp_path}/{run}/checkpoints/exp/t{i}" for i in range(8)]
        threads = [threading.Thread(target=make, args=(barrier, errors, path)) for path in paths]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        assert len(list((tmp_path / str(run) / "checkpoints" / "exp").iterdir())) == 8
