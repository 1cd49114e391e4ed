"""Suite-wide setup: strict contracts, the real nats-server fixture."""

import atexit
import os
import pwd
import shutil
import tempfile

# Readers forbid unknown fields in tests (STYLE.md); set before contracts is imported.
os.environ["TRIALBUS_CONTRACTS_STRICT"] = "1"
# Every `trialbus up` a test starts registers in the runtime dir (trialbus/runtime.py): the suite's own, so that no
# test finds, cleans or is found by a stack of the person running it. mkdtemp's dir is 0700, as the registry needs.
os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="trialbus-tests-runtime-")
atexit.register(shutil.rmtree, os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)
# Trials run as the test's own user (as they do for an adapter that is not root): the tests' directories are
# private (0700), and the interpreter may be too. tests/e2e/test_trial_isolation.py runs them as another user.
os.environ.setdefault("TRIALBUS_TRIAL_USER", pwd.getpwuid(os.geteuid()).pw_name)

import pytest  # noqa: E402

from tests.fixtures.nats import nats_server  # noqa: E402,F401
from tests.fixtures.sshd import ssh_key, sshd, sshd_pair  # noqa: E402,F401


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Lets fixtures see whether the test failed (to print service logs on failure).
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def pytest_collection_modifyitems(session, config, items):
    # The compose tests run last: the images they need build meanwhile (make test starts that).
    items.sort(key=lambda item: item.nodeid.startswith("tests/e2e/test_compose.py"))
