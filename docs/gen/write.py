"""Hands the generated reference pages to mkdocs (the mkdocs-gen-files plugin runs this at build time)."""

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).parent))
from reference import pages  # noqa: E402

for path, text in pages().items():
    with mkdocs_gen_files.open(path, "w") as page:
        page.write(text)
