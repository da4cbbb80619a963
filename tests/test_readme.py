"""The README's Python runs as written: every ```python block, in order, from the repository
root, in one fresh namespace (a block may use names an earlier block defined)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def python_blocks(markdown: str) -> list[tuple[int, str]]:
    """(line of the opening fence, code) of each ```python block."""
    return [
        (markdown.count("\n", 0, found.start()) + 1, found.group(1))
        for found in PYTHON_BLOCK.finditer(markdown)
    ]


def test_the_blocks_are_found():
    sample = "text\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = x\n```\n"
    assert python_blocks(sample) == [(2, "x = 1\n"), (8, "y = x\n")]


def test_every_python_block_of_the_readme_runs(monkeypatch):
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no ```python block"
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "readme"}
    for line, code in blocks:
        # compiled under README.md's name and line, so a traceback points into the README
        exec(compile("\n" * line + code, str(README), "exec"), namespace)
    # and it does what its comments say: the events it feeds are card testing
    assert [m["name"] for m in namespace["matches"]] == ["card_testing"]
