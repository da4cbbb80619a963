"""``vigil import eql``: Elasticsearch's EQL operators, sequences and refusals, each run through
the embedded engine on events built to match and to miss."""

from __future__ import annotations

import pytest

from cep.cli.main import main
from cep.engine import Engine
from query_lang import check_program
from query_lang.imports.eql import EqlImportError, EqlOptions, EqlSource, import_eql

OPTIONS = EqlOptions(id_field="id", schema={"*": {"id": "int", "k": "int"}})


def run(query: str, events: list[dict], options: EqlOptions = OPTIONS) -> list[list[int]]:
    """The ids of each match of ``query`` over ``events`` (time: their position, in seconds)."""
    result = import_eql([EqlSource("q.eql", query)], options)
    assert not result.errors, result.errors[0].render()
    program, errors = check_program(text=result.text)
    assert not errors, errors[0].render()
    engine = Engine(now_ms=10**12)
    engine.register(result.text)
    for i, event in enumerate(events):
        engine.feed({"id": i, "timestamp": i, **event})
    engine.close()
    found = []
    for match in engine.drain():
        bound = match["events"]
        ordered = sorted(bound, key=lambda v: int(v[1:] or 0))
        found.append([i for v in ordered for i in bound[v]])
    return found


def refusal(query: str, options: EqlOptions = OPTIONS) -> EqlImportError:
    result = import_eql([EqlSource("q.eql", query)], options)
    assert result.errors and not result.rules
    return result.errors[0]


def P(**fields):  # noqa: N802 - a process event
    return {"stream": "process", **fields}


@pytest.mark.parametrize(
    ("condition", "matching"),
    [
        ('process.name : "CMD.exe"', [0, 1]),  # `:` ignores case
        ('process.name == "cmd.exe"', [0]),  # `==` is exact
        ('process.name : "c?d*"', [0, 1]),  # wildcards * and ?
        ('process.name like "c*"', [0]),
        ('process.name like~ "C*"', [0, 1]),
        ('process.name : ("x*", "*.EXE")', [0, 1]),
        ('process.name in ("cmd.exe", "x")', [0]),
        ('process.name in~ ("CMD.EXE", "x")', [0, 1]),
        ('process.name regex~ "C.D\\\\.exe"', [0, 1]),
        ('process.name regex "c.d"', []),  # Lucene regexes match the whole value
        ('startsWith~(process.name, "CM")', [0, 1]),
        ('endsWith(process.name, ".exe")', [0]),
        ('length(process.name) == 7', [0, 1]),
        ('?process.pe.original_file_name == null', [0, 1, 2]),
        ('pid + 1 == 3 or pid / 2 == 2', [0, 1, 2]),  # integers divide to an integer: 5 / 2 == 2
        ('not (process.name == "cmd.exe")', [1]),  # null is neither true nor false
        ('cidrMatch(source.ip, "10.0.0.0/8", "192.168.0.0/16")', [0, 2]),
    ],
)
def test_operators(condition, matching):
    events = [
        P(process={"name": "x"}, **{"process_name": "cmd.exe", "pid": 5, "source_ip": "10.1.1.1"}),
        P(process_name="CMD.EXE", pid=2, source_ip="8.8.8.8"),
        P(pid=4, source_ip="192.168.1.1"),
    ]
    assert run(f"process where {condition}", events) == [[i] for i in matching]


@pytest.mark.parametrize(
    ("condition", "matching"),
    [
        ('indexOf(process.name, "exe") == 4', [0]),
        ('indexOf~(process.name, "EXE") == 4', [0, 1]),
        ('indexOf(process.name, ".", -100) == 3', [0, 1]),  # a negative start is 0 here
        ('indexOf(process.name, "z") == null', [0, 1, 2]),  # found nowhere, or no name
        ('substring(process.name, -4) == ".exe"', [0]),
        ('substring(process.name, 0, 3) : "CMD"', [0, 1]),
        ('concat(process.name, "/", pid) == "cmd.exe/5"', [0]),
        ('concat(process.name, pid) != null', [0, 1]),
    ],
)
def test_string_functions(condition, matching):
    events = [P(process_name="cmd.exe", pid=5), P(process_name="CMD.EXE", pid=2), P(pid=4)]
    options = EqlOptions(id_field="id", schema={"*": {"id": "int", "pid": "int"}})
    assert run(f"process where {condition}", events, options) == [[i] for i in matching]


@pytest.mark.parametrize(
    ("condition", "matching"),
    [
        ('between(name, "s", "e") == "yst"', [0]),  # the classic dialect ignores case
        ('between(name, "s", "e", true) == "ystem idl"', [0]),
        ('arrayContains(tags, "EN", "x")', [0]),
        ('not arrayContains(tags, "fr")', [0]),  # no tags: null, neither true nor false
        ('tags[1] == "EN"', [0]),
        ('length(tags) == 1', [1]),
        ('arraySearch(tags, t, t == "FR")', [1]),
        ('not arraySearch(tags, t, t == "fr")', [0, 2]),  # no tags: false
        ('safe(name / 2) == null', [0, 1, 2]),  # arithmetic on a string is null
        ('arraySearch(tags, t, endsWith(t, "-us"))', [0]),
        ('not arraySearch(tags, t, startsWith(t, "f"))', [0, 2]),
        ('arrayCount(tags, t, t == "EN*") == 2', [0]),
        ('arrayCount(tags, t, t == "*") == 0', [2]),  # no tags: none counted
    ],
)
def test_classic_string_and_array_functions(condition, matching):
    options = EqlOptions(dialect="classic", id_field="id", schema={
        "*": {"id": "int", "name": "string", "tags": "list<string>"}})
    events = [P(name="System Idle", tags=["en-US", "en"]), P(name="smss.exe", tags=["fr"]),
              P(name="x")]
    assert run(f"process where {condition}", events, options) == [[i] for i in matching]


def test_sequence_keeps_the_latest_pending_sequence_per_key_and_reports_overlaps():
    events = [P(k=1, t="a"), P(k=1, t="a"), P(k=2, t="a"), P(k=1, t="b"), P(k=2, t="b"),
              P(k=1, t="b")]
    query = 'sequence by k [process where t == "a"] [process where t == "b"]'
    # The second `a` of key 1 replaces the first; the last `b` finds nothing pending.
    assert run(query, events) == [[1, 3], [2, 4]]


def test_until_and_maxspan():
    events = [P(k=1, t="a"), P(k=1, t="stop"), P(k=1, t="b"),
              P(k=2, t="a"), P(k=2, t="b")]
    query = ('sequence by k with maxspan=1s [process where t == "a"] [process where t == "b"] '
             'until [process where t == "stop"]')
    assert run(query, events) == [[3, 4]]
    assert run(query.replace("1s", "500ms"), events) == []


def test_missing_events_and_runs():
    events = [P(k=1, t="a"), P(k=1, t="x"), P(k=1, t="b"),
              P(k=2, t="a"), P(k=2, t="b"), P(k=2, t="b")]
    middle = ('sequence by k with maxspan=1m [process where t == "a"] '
              '![process where t == "x"] '
              '[process where t == "b"]')
    assert run(middle, events) == [[3, 4]]
    runs = 'sequence by k [process where t == "a"] [process where t == "b"] with runs=2'
    assert run(runs, events) == [[3, 4, 5]]
    trailing = ('sequence by k with maxspan=1s [process where t == "a"] '
                '![process where t == "x"]')
    assert run(trailing, events) == [[3]]


def test_per_step_join_keys_follow_a_process_to_its_child():
    events = [P(pid=10, name="cmd"), {"stream": "network", "pid": 11, "ppid": 10},
              {"stream": "network", "pid": 12, "ppid": 99}]
    query = 'sequence [process where name == "cmd"] by pid [network where true] by ppid'
    assert run(query, events, EqlOptions(
        id_field="id", schema={"*": {"id": "int", "pid": "int", "ppid": "int"}})) \
        == [[0, 1]]


def test_join_keys_that_are_expressions_become_step_keys():
    events = [P(pid=10, name="cmd"), {"stream": "network", "pid": 11, "ppid": 20},
              {"stream": "network", "pid": 12, "ppid": 10},
              {"stream": "network", "pid": 13, "ppid": 5}]
    options = EqlOptions(id_field="id", schema={"*": {"id": "int", "pid": "int", "ppid": "int"}})
    query = ('sequence [process where name == "cmd"] by pid * 2, string(pid) '
             '[network where true] by ppid, string(ppid - 10)')
    result = import_eql([EqlSource("q.eql", query)], options)
    assert "by (pid * 2, concat(pid))" in result.text
    assert run(query, events, options) == [[0, 1]]
    # EQL writes an integer quotient as an integer, Vigil's division gives a float.
    refused = refusal(query.replace("ppid - 10", "ppid / 2"), options)
    assert refused.construct == "text of an integer division"
    assert run('sequence [process where true] by pid * 2 [network where true] by ppid',
               events, options) == [[0, 1]]
    # EQL's length() of a number is null for every event, and joins nulls: the position joins
    # nothing apart and is left out.
    assert run('sequence [process where true] by pid, length(pid) '
               '[network where true] by ppid, length(ppid)', events, options) == [[0, 2]]


def test_an_expression_join_key_types_its_fields_without_a_schema():
    # Nothing but the key reads pid and ppid: `* 2` says they are numbers (before, the key
    # was written as null and the rule joined every event as one).
    events = [P(pid=10, t="a"), P(pid=11, ppid=10, t="b"), P(pid=12, ppid=99, t="b")]
    query = 'sequence [process where t == "a"] by pid * 2 [process where t == "b"] by ppid * 2'
    text = import_eql([EqlSource("q.eql", query)], OPTIONS).text
    assert "by pid * 2" in text and "by ppid * 2" in text and "by null" not in text
    assert run(query, events) == [[0, 1]]


def test_fork_keeps_the_extended_sequence_pending():
    events = [P(k=1, t=t) for t in "abbccabbc"]
    query = 'sequence by k [process where t == "a"] [process where t == "b"] {} ' \
            '[process where t == "c"] {}'
    # what the eql package's engine returns for these events
    assert run(query.format("", ""), events) == [[0, 1, 3], [5, 6, 8]]
    assert run(query.format("fork=true", ""), events) == [[0, 2, 3], [5, 7, 8]]
    assert run(query.format("", "fork=true"), events) == [[0, 1, 3], [0, 1, 4], [5, 6, 8]]
    text = import_eql([EqlSource("q.eql", query.format("fork=true", ""))], OPTIONS).text
    assert "contiguity any for s2" in text


def test_classic_string_join_keys_are_compared_ignoring_case():
    events = [P(user="Alice", t="a"), P(user="ALICE", t="b"), P(user="bob", t="b")]
    options = EqlOptions(id_field="id", dialect="classic",
                         schema={"*": {"id": "int", "user": "string", "t": "string"}})
    query = 'sequence by user [process where t == "a"] [process where t == "b"]'
    assert "by lower(user)" in import_eql([EqlSource("q.eql", query)], options).text
    assert run(query, events, options) == [[0, 1]]
    assert run(query, events, EqlOptions(id_field="id", dialect="classic", case_sensitive=True,
                                         schema=options.schema)) == []


def test_a_sequence_filter_drops_the_completed_sequence_it_rejects():
    events = [P(k=1, t="a", v=0), P(k=1, t="b", v=1), P(k=1, t="b", v=2),
              P(k=2, t="a", v=0), P(k=2, t="b", v=2)]
    options = EqlOptions(id_field="id", schema={"*": {"id": "int", "k": "int", "v": "int"}})
    query = 'sequence by k [process where t == "a"] [process where t == "b"]'
    assert run(query, events, options) == [[0, 1], [3, 4]]
    # [0, 1] completes and is filtered out: EQL no longer holds 0 pending for the third event
    # (a condition on the second step would have matched [0, 2]).
    assert run(query + " | filter events[1].v == 2", events, options) == [[3, 4]]
    assert run(query + " | filter events[0].v == 0 and events[1].v != 2", events,
               options) == [[0, 1]]
    # an arraySearch's element inside the filter is the element, not an event's field
    lists = EqlOptions(id_field="id", schema={"*": {"id": "int", "k": "int",
                                                    "xs": "list<string>"}})
    tagged = [P(k=1, t="a", xs=["p"]), P(k=1, t="b", xs=["q", "r"]),
              P(k=2, t="a", xs=[]), P(k=2, t="b", xs=["z"])]
    assert run(query + ' | filter arraySearch(events[1].xs, x, x == "r" or x == "q")', tagged,
               lists) == [[0, 1]]


def test_json_arrays_of_records_are_searched():
    options = EqlOptions(id_field="id", schema={"*": {"id": "int", "m": "json"}})
    events = [P(m={"sub": [{"a": "x1", "c": [{"y": 1}]}, {"a": "z"}], "o": 1}),
              P(m={"sub": [{"a": "q", "c": [{"y": 2}]}], "o": 1}),
              P(m={"sub": "not a list"}), P(m=None), P()]
    assert run('process where arraySearch(m.sub, s, s.a : "X*")', events, options) == [[0]]
    assert run("process where arraySearch(m.sub, s, arraySearch(s.c, n, n.y == m.o))", events,
               options) == [[0]]
    assert run("process where arrayCount(m.sub, s, true) == 1", events, options) == [[1]]
    assert run("process where m and m.o == 1", events, options) == [[0], [1]]


@pytest.mark.parametrize(
    ("query", "construct", "column"),
    [
        ("process where true | head 5", "pipe head", 22),
        ("join [process where true] [file where true]", "join", 7),
        ("process where arrayCount(a, x, x == \"y\") == 1", "array type", 26),
        ("process where between(a, \"b\", \"c\") == \"x\"", "function between", 15),
        ("process where indexOf(a, \"b\", k) == 1", "indexOf start from a field", 31),
        ("process where arraySearch(a, x, x.y == 1)", "array type", 27),
        ("process where a[0] == \"x\"", "array index", 15),
        ("sequence with maxspan=1m ![process where a == 1] [process where true]",
         "leading missing event", 26),
        ("sequence with maxspan=1m [process where true] ![file where true] fork=true "
         "[file where true]", "fork of a missing event", 47),
        ("process where descendant of [process where true]", "descendant of", 15),
        ("process where true | unique_count a", "pipe unique_count", 22),
        ("sequence [process where true] [file where true] | unique a", "pipe unique", 51),
        ("sequence [process where true] [file where true] | filter pid == 1",
         "sequence filter field", 58),
        ("sequence [process where true] [file where true] | filter events[2].pid == 1",
         "syntax", 1),
    ],
)
def test_refusals_name_the_construct_and_its_place(query, construct, column):
    err = refusal(query)
    assert (err.construct, err.line, err.column) == (construct, 1, column)
    assert "^" in err.render()


def test_unique_reports_the_first_event_per_distinct_values():
    names = ["cmd.exe", "CMD.exe", "sh", "cmd.exe", None, None, "bash"]
    events = [P(process_name=n, user="u" if i < 5 else "v") for i, n in enumerate(names)]
    assert run("process where true | unique process.name", events) == [[0], [1], [2], [4], [6]]
    assert run("process where true | unique process.name, user", events) == [
        [0], [1], [2], [4], [5], [6]]
    # A condition's three values (true, false, null) are three groups.
    assert run("process where true | unique length(process.name) == 7", events) == [
        [0], [2], [4]]


def test_detection_rule_toml_through_the_command_line(tmp_path, capsys):
    rule = tmp_path / "rule.toml"
    rule.write_text(
        "[metadata]\nmaturity = \"production\"\n\n[rule]\nname = \"Shell From Office\"\n"
        "severity = \"high\"\nrisk_score = 73\nrule_id = \"abc\"\nlanguage = \"eql\"\n"
        "query = '''\nprocess where process.parent.name : \"winword.exe\" and\n"
        "  process.name : (\"cmd.exe\", \"powershell.exe\") | tail 1\n'''\n"
    )
    assert main(["import", "eql", str(rule)]) == 1
    err = capsys.readouterr().err
    assert f"{rule}:12:50: error: pipe `| tail`" in err
    assert main(["import", "eql", "--ignore-pipe", "tail", str(rule)]) == 0
    out = capsys.readouterr().out
    assert 'rule shell_from_office "Shell From Office"' in out
    assert "severity high" in out and '"risk_score:73"' in out
    assert "# pipe `| tail 1` ignored" in out
    target = tmp_path / "out.vigil"
    target.write_text(out)
    assert main(["check", str(target)]) == 0


def test_stream_mapping_and_schema(tmp_path, capsys):
    query = tmp_path / "q.eql"
    query.write_text('process where pid == 4')
    schema = tmp_path / "schema.json"
    schema.write_text('{"*": {"pid": "float"}}')
    assert main(["import", "eql", "--stream", "process=proc", "--schema", str(schema),
                 "--time-unit", "ms", str(query)]) == 0
    out = capsys.readouterr().out
    assert "stream proc (\n  pid float,\n  timestamp timestamp\n) time timestamp unit ms" in out
    assert "from proc" in out


def test_elasticsearch_length_of_an_array_is_refused():
    options = EqlOptions(schema={"*": {"tags": "list<string>"}})
    err = refusal("process where length(tags) == 2", options)
    assert (err.construct, err.column) == ("length of an array", 22)
    classic = EqlOptions(dialect="classic", schema={"*": {"tags": "list<string>"}})
    assert not import_eql([EqlSource("q.eql", "process where length(tags) == 2")], classic).errors
