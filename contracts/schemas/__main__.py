"""``python -m contracts.schemas``: regenerate the committed JSON Schemas."""

from contracts.schemas import write_all

for path in write_all():
    print(f"wrote {path}")
