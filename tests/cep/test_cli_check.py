"""`vigil check` end to end: exit codes, error output, glob expansion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cep.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run_vigil(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cep.cli", *args], cwd=cwd, capture_output=True, text=True
    )


def test_examples_check_clean():
    result = run_vigil("check", "examples/**/*.vigil")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")


def test_errors_exit_1_and_name_file_line_column(tmp_path):
    bad = tmp_path / "bad.vigil"
    bad.write_text(
        "stream s (a int, ts timestamp) time ts\n"
        "rule r from s pattern x within soon\n"
        "rule q from s pattern y define y as b > 1\n"
    )
    result = run_vigil("check", str(bad))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == f"{bad}:2:32: error: unexpected 'soon'; expected a duration such as 10m"
    assert lines[1] == "  rule r from s pattern x within soon"
    assert lines[2] == "  " + " " * 31 + "^"
    assert f"{bad}:3:37: error: undeclared field 'b'" in result.stderr
    assert lines[-1] == "2 error(s) in 1 file(s)"


def test_every_file_given_is_checked(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.vigil").write_text(f"rule {name} from nowhere_{name} pattern x\n")
    result = run_vigil("check", str(tmp_path))
    assert result.returncode == 1
    assert "nowhere_a" in result.stderr and "nowhere_b" in result.stderr


def test_usage_problems_exit_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "missing.vigil")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["check"]) == 2
    assert main(["no-such-command"]) == 2


def test_format_prints_canonical_text(capsys):
    assert main(["format", "examples/trading.vigil"]) == 0
    out = capsys.readouterr().out
    assert "pattern start down+ up+" in out and "contiguity strict" in out


def test_check_warns_about_queries_the_index_cannot_help(tmp_path, capsys):
    rules = tmp_path / "queries.vigil"
    rules.write_text(
        "stream news (id string, title text, source string, ts timestamp) time ts\n"
        "stream wire (id string, title text, source string, ts timestamp) time ts\n"
        'query not_tabloid "anything but tabloids"\n  from news\n  match NOT source:tabloid\n'
        'query fine "indexed"\n  from news, wire\n  match title:acme AND NOT source:tabloid\n'
        'query empty "no word in it"\n  from wire\n  match title:"!!!"\n',
        encoding="utf-8",
    )
    assert main(["check", str(rules)]) == 0  # warnings never fail the check
    captured = capsys.readouterr()
    assert captured.out.startswith("ok: 1 file(s), 0 rule(s), 3 query(ies)")
    warnings = [line for line in captured.err.splitlines() if ": warning: " in line]
    assert warnings == [
        f"{rules}:3:1: warning: query 'not_tabloid' requires no term, value or field a "
        "document must contain: it is verified against every 'news' event, outside the index",
        f"{rules}:9:1: warning: query 'empty' can never match a 'wire' event",
    ]
    assert 'query not_tabloid "anything but tabloids"\n  ^' in captured.err
    assert main(["check", "examples/"]) == 0
    assert capsys.readouterr().err == ""


def test_check_warns_about_queries_searching_undeclared_fields(tmp_path, capsys):
    rules = tmp_path / "fields.vigil"
    rules.write_text(
        "stream news (id string, title text, ts timestamp) time ts\n"
        "stream wire (id string, title text, tilte text, ts timestamp) time ts\n"
        "query typo from news, wire\n"
        "  match title:acme AND (tilte:merger OR user.name:bob) AND NOT stream:wire\n"
        "query fine from news match id:d1 OR _exists_:title\n",
        encoding="utf-8",
    )
    assert main(["check", str(rules)]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if ": warning: " in line]
    # Only news lacks 'tilte'; a nested field cannot be declared; stream and id always exist.
    assert warnings == [
        f"{rules}:4:25: warning: query 'typo' searches field 'tilte', which stream 'news' does "
        "not declare: it is read from the events as a keyword field, if they carry it (check "
        "the spelling, or declare it)",
    ]
    snippet = "    match title:acme AND (tilte:merger OR user.name:bob) AND NOT stream:wire\n"
    assert snippet + " " * 26 + "^\n" in err  # the caret under the field
