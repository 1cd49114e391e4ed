"""The committed JSON Schemas match the models (run `make schemas` after changing a contract)."""

import pytest

from contracts.schemas import HERE, MODELS, render


@pytest.mark.parametrize("name", sorted(MODELS))
def test_committed_schema_is_current(name: str) -> None:
    path = HERE / f"{name}.schema.json"
    assert path.exists(), f"{path.name} is missing: run `make schemas`"
    assert path.read_text() == render(MODELS[name]), f"{path.name} is stale: run `make schemas`"
