"""Suite-wide setup: strict contracts, the real nats-server fixture."""

import os

# Readers forbid unknown fields in tests (STYLE.md); set before contracts is imported.
os.environ["TRIALBUS_CONTRACTS_STRICT"] = "1"

from tests.fixtures.nats import nats_server  # noqa: E402,F401
