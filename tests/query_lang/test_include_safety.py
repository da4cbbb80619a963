"""Rule files can only read rule files: an ``include`` outside the include roots, of a device,
a pipe or an oversized file is an error at the include that names the path and the reason and
never shows what the file holds; legitimate includes keep working."""

from __future__ import annotations

import os
import sys
import time

import pytest

from cep.cli import main
from query_lang import IncludeError, check_program, load_program
from query_lang import includes as include_policy

STREAM = "stream s (x int, ts timestamp) time ts\n"
RULE = "rule r from s pattern a define a as x > 1\n"


@pytest.fixture
def rules(tmp_path, monkeypatch):
    """A rule directory, with the working directory elsewhere and no VIGIL_INCLUDE_PATH, so
    the only roots are the rule file's directory and an empty working directory."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv(include_policy.INCLUDE_PATH_VARIABLE, raising=False)
    directory = tmp_path / "project" / "rules"
    directory.mkdir(parents=True)
    return directory


def including(directory, target, *, before="# shared streams\n\n"):
    """A rule file whose include (line 3, column 1 by default) names ``target``."""
    path = directory / "main.vigil"
    path.write_text(f'{before}include "{target}"\n{STREAM}')
    return path


def only_error(path, **kwargs):
    _, errors = check_program([str(path)], **kwargs)
    assert len(errors) == 1, [e.render() for e in errors]
    (error,) = errors
    assert isinstance(error, IncludeError)
    assert (error.file, error.line, error.column) == (str(path), 3, 1)
    return error


def secrets_of_this_process() -> list[str]:
    with open("/proc/self/environ", "rb") as handle:
        entries = handle.read().split(b"\0")
    return [e.decode("utf-8", "replace") for e in entries if len(e) > 3]


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs Linux /proc")
def test_proc_self_environ_is_refused_and_never_echoed(rules, monkeypatch):
    monkeypatch.setenv("VIGIL_TEST_WEBHOOK_SECRET", "whsec_do_not_print_me")
    error = only_error(including(rules, "/proc/self/environ"))
    rendered = error.render()
    assert "cannot include /proc/self/environ" in error.message
    assert "outside the directories rule files may include from" in error.message
    assert str(rules) in error.message  # the roots are named, so the fix is clear
    for entry in secrets_of_this_process():
        assert entry not in rendered
    # the rendered error shows the include line of the including file, nothing else
    assert rendered.splitlines()[1:] == ['  include "/proc/self/environ"', "  ^"]


@pytest.mark.skipif(not os.path.exists("/etc/passwd"), reason="needs /etc/passwd")
def test_parent_directories_cannot_climb_out(rules):
    climb = "../" * (len(rules.parts) + 2) + "etc/passwd"
    error = only_error(including(rules, climb))
    assert "cannot include /etc/passwd" in error.message
    assert "outside" in error.message
    assert "root:" not in error.render()


@pytest.mark.skipif(not os.path.exists("/etc/passwd"), reason="needs /etc/passwd")
def test_a_symlink_pointing_outside_is_refused_and_its_target_named(rules):
    (rules / "common.vigil").symlink_to("/etc/passwd")
    error = only_error(including(rules, "common.vigil"))
    assert f"cannot include {rules / 'common.vigil'} (it resolves to /etc/passwd)" in error.message
    assert "root:" not in error.render()


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_dev_zero_is_refused_promptly_even_inside_a_root(rules):
    start = time.monotonic()
    outside = only_error(including(rules, "/dev/zero"))
    assert "outside" in outside.message
    # allowed by an include root, it is still no rule file: refused without being read
    inside = only_error(including(rules, "/dev/zero"), include_roots=["/dev"])
    assert inside.message == "cannot include /dev/zero: not a regular file (a character device)"
    assert time.monotonic() - start < 5


def test_a_named_pipe_is_refused_without_blocking(rules):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    os.mkfifo(rules / "pipe.vigil")
    error = only_error(including(rules, "pipe.vigil"))
    assert error.message == (
        f"cannot include {rules / 'pipe.vigil'}: not a regular file (a named pipe)"
    )


def test_a_directory_is_refused(rules):
    (rules / "sub").mkdir()
    error = only_error(including(rules, "sub"))
    assert error.message.endswith("not a regular file (a directory)")


def test_an_oversized_file_is_refused_without_being_read(rules):
    big = rules / "big.vigil"
    with open(big, "wb") as handle:  # sparse: cheap to make, large to read
        handle.truncate(include_policy.MAX_RULE_FILE_BYTES + 1)
    error = only_error(including(rules, "big.vigil"))
    assert error.message == (
        f"cannot include {big}: 16,777,217 bytes, over the 16,777,216-byte limit of a rule file"
    )


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_the_read_is_bounded_when_the_size_a_file_reports_lies(rules, monkeypatch):
    # /proc files report size 0 (and this one holds over 500 bytes); the read itself stops
    # one byte past the cap, which the including file stays under
    monkeypatch.setattr(include_policy, "MAX_RULE_FILE_BYTES", 200)
    error = only_error(including(rules, "/proc/self/status"), include_roots=["/proc"])
    assert error.message == (
        "cannot include /proc/self/status: over the 200-byte limit of a rule file"
    )
    assert "Name:" not in error.render()


def test_a_file_that_is_not_utf8_is_refused_without_its_bytes(rules):
    (rules / "bin.vigil").write_bytes(b"stream ok (x int)\n\xff\xfesecret\n")
    error = only_error(including(rules, "bin.vigil"))
    assert error.message == f"cannot include {rules / 'bin.vigil'}: not UTF-8 text (line 2)"
    assert "secret" not in error.render()


def test_a_file_named_on_the_command_line_is_read_with_the_same_cap(rules, monkeypatch):
    monkeypatch.setattr(include_policy, "MAX_RULE_FILE_BYTES", 8)
    path = rules / "long.vigil"
    path.write_text(STREAM)
    _, errors = check_program([str(path)])
    assert [e.message for e in errors] == [
        f"cannot read {path}: over the 8-byte limit of a rule file"
    ]


def test_an_include_in_a_subdirectory_still_works(rules):
    (rules / "shared").mkdir()
    (rules / "shared" / "streams.vigil").write_text(STREAM)
    path = rules / "main.vigil"
    path.write_text(f'include "shared/streams.vigil"\n{RULE}')
    program = load_program([str(path)])
    assert list(program.rules) == ["r"] and list(program.streams) == ["s"]


def test_includes_inside_includes_resolve_relative_to_the_including_file(rules):
    (rules / "shared" / "deeper").mkdir(parents=True)
    (rules / "shared" / "deeper" / "streams.vigil").write_text(STREAM)
    # relative to shared/, not to the top file: "deeper/..." exists only there
    (rules / "shared" / "all.vigil").write_text('include "deeper/streams.vigil"\n')
    # and ".." from a subdirectory back into the tree of the file given is allowed
    (rules / "shared" / "deeper" / "lists.vigil").write_text(
        'include "../../local.vigil"\n'
    )
    (rules / "local.vigil").write_text('list vips ("a", "b")\n')
    path = rules / "main.vigil"
    path.write_text(
        f'include "shared/all.vigil"\ninclude "shared/deeper/lists.vigil"\n{RULE}'
    )
    program = load_program([str(path)])
    assert list(program.streams) == ["s"] and list(program.lists) == ["vips"]


def test_a_symlink_inside_the_tree_is_followed(rules):
    (rules / "real.vigil").write_text(STREAM)
    (rules / "alias.vigil").symlink_to(rules / "real.vigil")
    path = rules / "main.vigil"
    path.write_text(f'include "alias.vigil"\n{RULE}')
    assert list(load_program([str(path)]).rules) == ["r"]


def test_include_roots_reach_a_shared_directory(rules, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "streams.vigil").write_text(STREAM)
    path = rules / "main.vigil"
    path.write_text(f'include "{shared / "streams.vigil"}"\n{RULE}')
    _, errors = check_program([str(path)])
    # refused at the include; the rule's stream is then undeclared, and says so
    assert "outside" in errors[0].message and errors[0].line == 1
    assert list(load_program([str(path)], include_roots=[shared]).rules) == ["r"]


def test_vigil_include_path_sets_the_roots_of_the_command_line(rules, tmp_path, monkeypatch,
                                                               capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "streams.vigil").write_text(STREAM)
    path = rules / "main.vigil"
    path.write_text(f'include "{shared / "streams.vigil"}"\n{RULE}')
    assert main(["check", str(path)]) == 1
    assert f"{path}:1:1: error: cannot include {shared / 'streams.vigil'}" in (
        capsys.readouterr().err
    )
    roots = os.pathsep.join(["/nowhere", str(shared)])
    monkeypatch.setenv(include_policy.INCLUDE_PATH_VARIABLE, roots)
    assert main(["check", str(path)]) == 0


def test_the_working_directory_is_no_root(rules, monkeypatch):
    sibling = rules.parent / "other"
    sibling.mkdir()
    (sibling / "streams.vigil").write_text(STREAM)
    path = rules / "main.vigil"
    path.write_text(f'include "../other/streams.vigil"\n{RULE}')
    monkeypatch.chdir(rules.parent)  # where the process runs does not widen what it may read
    monkeypatch.delenv(include_policy.INCLUDE_PATH_VARIABLE, raising=False)
    error = check_program([str(path)])[1][0]
    assert "outside the directories rule files may include from" in error.message
    monkeypatch.setenv(include_policy.INCLUDE_PATH_VARIABLE, str(rules.parent))
    assert check_program([str(path)])[1] == []


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs Linux /proc")
def test_vigil_check_refuses_proc_environ_without_echoing_it(rules, capsys):
    path = including(rules, "/proc/self/environ")
    assert main(["check", str(path)]) == 1
    captured = capsys.readouterr()
    assert f"{path}:3:1: error: cannot include /proc/self/environ" in captured.err
    for entry in secrets_of_this_process():
        assert entry not in captured.err + captured.out


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX paths")
def test_a_missing_file_outside_the_roots_is_outside_not_missing(rules):
    # no oracle for which files exist outside the roots
    error = only_error(including(rules, "/etc/no-such-file-for-vigil"))
    assert "outside" in error.message and "not found" not in error.message
