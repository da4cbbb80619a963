"""The package's public surface and its isolation from the rest of Vigil."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import cep.alerts

PACKAGE = Path(cep.alerts.__file__).parent


def test_all_lists_exactly_the_public_names() -> None:
    exported = set(cep.alerts.__all__)
    assert len(exported) == len(cep.alerts.__all__)
    for name in exported:
        assert hasattr(cep.alerts, name), name
    for required in (
        "Outbox",
        "Dispatcher",
        "DrainResult",
        "Endpoint",
        "Clock",
        "ManualClock",
        "WebhookReceiver",
        "Throttle",
        "AlertError",
        "status",
        "replay",
        "sign",
        "verify",
    ):
        assert required in exported


MAY_IMPORT = {"routing": {"query_lang"}, "errors": {"query_lang"}, "throttle": {"sketches"}}
"""Routing reads the program's ``notify`` and ``throttle`` clauses and the errors are rooted at
``VigilError``; throttle state is framed by the one state codec; delivery knows no program."""


def test_modules_import_nothing_else_of_vigil_and_no_pyspark() -> None:
    for module in PACKAGE.glob("*.py"):
        allowed = MAY_IMPORT.get(module.stem, set())
        tree = ast.parse(module.read_text(), filename=str(module))
        assert tree.body[0].value.value  # a module docstring  # type: ignore[attr-defined]
        future = [
            node
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module == "__future__"
        ]
        assert future, f"{module.name} lacks 'from __future__ import annotations'"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module or ""]
            elif isinstance(node, ast.Import):
                roots = [alias.name for alias in node.names]
            else:
                continue
            for root in roots:
                top = root.split(".")[0]
                assert top not in {
                    "cep",
                    "pyspark",
                    "query_lang",
                    "percolator",
                    "sketches",
                    "spark_udf",
                } - allowed, f"{module.name} imports {root}"


def test_importing_the_package_loads_no_pyspark() -> None:
    code = "import sys, cep.alerts; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
