"""`vigil explain`: the compiled automaton as text and as Graphviz DOT that renders."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cep.cli import main


def test_explain_text(capsys):
    assert main(["explain", "examples/fraud.vigil", "--rule", "card_testing"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rule card_testing (version 1): contiguity relaxed")
    assert "TAKE probe" in out and "TAKE big" in out and "ACCEPT" in out


def test_explain_dot_renders(capsys, tmp_path):
    assert main(["explain", "examples/trading.vigil", "--rule", "v_shape", "--format", "dot"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith('digraph "v_shape" {') and dot.rstrip().endswith("}")
    if shutil.which("dot") is None:
        pytest.skip("Graphviz 'dot' is not installed; the DOT text was checked above")
    svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True)
    assert "<svg" in svg.stdout


def test_explain_unknown_rule_is_a_usage_error(capsys):
    assert main(["explain", "examples/trading.vigil", "--rule", "nope"]) == 2
    assert "rules: v_shape" in capsys.readouterr().err
