"""Imported Sigma rules run in the embedded engine: each fires on events built to match it and
stays silent on near misses (one letter, one modifier's edge away), and Windows event logs in
evtx JSON convert to the events of the streams the rules read."""

from __future__ import annotations

import json

import pytest
import yaml

from cep.engine import Engine
from query_lang.imports.sigma import LogSourceMap, convert_evtx_json, import_sigma

WINDOWS = {"product": "windows", "category": "process_creation"}

# (detection, events that must match, near misses that must not); fields of process_creation.
CASES = [
    ({"sel": {"Image|endswith": "\\whoami.exe"}, "condition": "sel"},
     [{"Image": "C:\\Windows\\System32\\WHOAMI.EXE"}, {"Image": "\\whoami.exe"}],
     [{"Image": "C:\\Windows\\System32\\whoami.exe.bak"}, {"Image": "whoami.exe"}, {}]),
    ({"sel": {"CommandLine|contains|all": [" -nop ", " -w hidden "]}, "condition": "sel"},
     [{"CommandLine": "powershell -NoP -NOP -W Hidden -c x"}],
     [{"CommandLine": "powershell -nop -c x"}, {"CommandLine": "powershell -nop-w hidden "}]),
    ({"sel": {"CommandLine|cased": "Invoke-Mimikatz"}, "condition": "sel"},
     [{"CommandLine": "Invoke-Mimikatz"}],
     [{"CommandLine": "invoke-mimikatz"}, {"CommandLine": "Invoke-Mimikatz "}]),
    # A backslash before * or ? escapes it in Sigma, so a separator before a wildcard is doubled.
    ({"sel": {"Image": "C:\\Users\\\\*\\AppData\\Local\\Temp\\\\?.exe"}, "condition": "sel"},
     [{"Image": "c:\\users\\bob\\appdata\\local\\temp\\x.exe"},
      {"Image": "C:\\Users\\a\nb\\AppData\\Local\\Temp\\Y.EXE"}],
     [{"Image": "C:\\Users\\bob\\AppData\\Local\\Temp\\xy.exe"},
      {"Image": "D:\\Users\\bob\\AppData\\Local\\Temp\\x.exe"}]),
    ({"sel": {"CommandLine|re": "-e(nc)? [A-Za-z0-9+/=]{8,}"}, "condition": "sel"},
     [{"CommandLine": "powershell -enc SQBFAFgAIAAo"}, {"CommandLine": "x -e AAAAAAAA y"}],
     [{"CommandLine": "powershell -ENC SQBFAFgAIAAo"}, {"CommandLine": "x -e AAAA"}]),
    ({"sel": {"CommandLine|re|i": "^net\\s+user"}, "condition": "sel"},
     [{"CommandLine": "NET  USER bob"}],
     [{"CommandLine": "cmd /c net user"}]),
    ({"sel": {"DestinationIp|cidr": ["10.0.0.0/8", "fe80::/10"]}, "condition": "sel"},
     [{"DestinationIp": "10.255.0.1"}, {"DestinationIp": "FE80::1"}],
     [{"DestinationIp": "11.0.0.1"}, {"DestinationIp": "fec0::1"}, {"DestinationIp": "host"}]),
    ({"sel": {"CommandLine|windash|contains": " -f "}, "condition": "sel"},
     [{"CommandLine": "x /F y"}, {"CommandLine": "x \u2013f y"}],
     [{"CommandLine": "x +f y"}]),
    ({"sel": {"CommandLine|base64offset|contains": "http://"}, "condition": "sel"},
     [{"CommandLine": "echo aHR0cDovL2V4YW1wbGU="}, {"CommandLine": "-e YWh0dHA6Ly9"}],
     [{"CommandLine": "echo aHR0cHM6Ly9"}]),
    ({"sel": {"OriginalFileName|exists": True}, "filter": {"Hashes|exists": True},
      "condition": "sel and not filter"},
     [{"OriginalFileName": "a.exe"}],
     [{"OriginalFileName": "a.exe", "Hashes": "x"}, {"Hashes": "x"}]),
    ({"sel": {"ParentImage|endswith": ["\\winword.exe", "\\excel.exe"]},
      "child": {"Image|endswith": "\\cmd.exe"}, "filter_1": {"CommandLine|contains": "safe"},
      "filter_2": {"User": "SYSTEM"}, "condition": "sel and child and not 1 of filter_*"},
     [{"ParentImage": "C:\\Office\\WINWORD.exe", "Image": "C:\\cmd.exe", "User": "bob"}],
     [{"ParentImage": "C:\\Office\\WINWORD.exe", "Image": "C:\\cmd.exe", "User": "system"},
      {"ParentImage": "C:\\Office\\excel.exe", "Image": "C:\\cmd.exe", "CommandLine": "SAFE"},
      {"ParentImage": "C:\\Office\\powerpnt.exe", "Image": "C:\\cmd.exe"}]),
    ({"sel": {"SourceUser|fieldref": "TargetUser"}, "condition": "sel"},
     [{"SourceUser": "Bob", "TargetUser": "bob"}],
     [{"SourceUser": "bob", "TargetUser": "alice"}, {"SourceUser": "bob"}]),
    ({"sel": {"CommandLine": None}, "condition": "sel"},
     [{"Image": "x"}],
     [{"CommandLine": ""}]),
]


def run(text: str, events: list[dict]) -> list[dict]:
    engine = Engine()
    engine.register(text)
    for event in events:
        engine.feed(event)
    engine.close()
    assert engine.drain_dead_letters() == []
    return engine.drain()


def _events(values: list[dict], stream: str = "windows_process_creation") -> list[dict]:
    return [
        {"stream": stream, "event_time": f"2024-05-01T10:00:{i:02d}Z", "id": i, **fields}
        for i, fields in enumerate(values)
    ]


@pytest.mark.parametrize(("detection", "hits", "misses"), CASES,
                         ids=[str(i) for i in range(len(CASES))])
def test_rule_fires_on_matches_and_not_on_near_misses(tmp_path, detection, hits, misses):
    path = tmp_path / "rule.yml"
    path.write_text(yaml.safe_dump(
        {"title": "t", "logsource": WINDOWS, "detection": detection}, sort_keys=False))
    result = import_sigma([str(path)])
    assert result.errors == [] and result.imported == 1
    matches = run(result.text, _events(hits + misses))
    matched = sorted(m["events"]["e"][0] for m in matches)
    assert matched == list(range(len(hits))), result.text


def _record(event_id: int, time: str, channel: str = "Microsoft-Windows-Sysmon/Operational",
            **data) -> dict:
    return {"Event": {
        "#attributes": {"xmlns": "http://schemas.microsoft.com/win/2004/08/events/event"},
        "System": {
            "Provider": {"#attributes": {"Name": "Microsoft-Windows-Sysmon"}},
            "EventID": event_id, "Channel": channel, "Computer": "host-1",
            "TimeCreated": {"#attributes": {"SystemTime": time}},
        },
        "EventData": data,
    }}


def test_evtx_json_becomes_events_of_the_mapped_streams():
    text = "\n".join(json.dumps(r, indent=2) for r in (
        _record(11, "2024-05-01T10:00:02.5Z", TargetFilename="C:\\x.dll", ProcessId=7),
        _record(1, "2024-05-01T10:00:01Z", Image="C:\\w.exe", ProcessId=8),
        _record(4624, "2024-05-01T10:00:03Z", channel="Security", LogonType=3),
        _record(99, "2024-05-01T10:00:04Z", channel="Other/Operational"),
    ))
    result = convert_evtx_json(text)
    assert [(e["stream"], e["event_time"]) for e in result.events] == [
        ("windows_process_creation", "2024-05-01T10:00:01Z"),
        ("windows_sysmon", "2024-05-01T10:00:01Z"),
        ("windows_file_event", "2024-05-01T10:00:02.5Z"),
        ("windows_sysmon", "2024-05-01T10:00:02.5Z"),
        ("windows_security", "2024-05-01T10:00:03Z"),
    ]
    first = result.events[0]
    assert (first["Image"], first["ProcessId"], first["EventID"], first["Provider_Name"]) == (
        "C:\\w.exe", "8", "1", "Microsoft-Windows-Sysmon")
    assert result.records == 4 and result.unmapped == {"Other/Operational/99": 1}


def test_converted_events_fit_the_imported_streams(tmp_path):
    rule = tmp_path / "r.yml"
    rule.write_text(yaml.safe_dump({
        "title": "t", "logsource": {"product": "windows", "category": "file_event"},
        "detection": {"sel": {"TargetFilename|endswith": ".DLL", "EventID": 11},
                      "condition": "sel"},
    }))
    result = import_sigma([str(rule)])
    events = convert_evtx_json(json.dumps(_record(
        11, "2024-05-01T10:00:02Z", TargetFilename="C:\\x.dll"))).events
    matches = run(result.text, [e for e in events if e["stream"] == "windows_file_event"])
    assert len(matches) == 1


def test_mapping_types_reach_the_converter(tmp_path):
    mapping_file = tmp_path / "m.yml"
    mapping_file.write_text(
        "streams:\n  - {logsource: {product: windows, service: security}, stream: sec,\n"
        "     evtx: [{channel: Security}], fields: {LogonType: int}}\n")
    mapping = LogSourceMap.load([str(mapping_file)])
    rule = tmp_path / "r.yml"
    rule.write_text(yaml.safe_dump({
        "title": "t", "logsource": {"product": "windows", "service": "security"},
        "detection": {"sel": {"LogonType|gte": 3}, "condition": "sel"},
    }))
    result = import_sigma([str(rule)], mapping)
    assert result.errors == []
    events = convert_evtx_json("".join(json.dumps(r) for r in (
        _record(4624, "2024-05-01T10:00:01Z", channel="Security", LogonType=2),
        _record(4624, "2024-05-01T10:00:02Z", channel="Security", LogonType="10"),
    )), mapping).events
    assert [e["LogonType"] for e in events] == [2, 10]
    assert [m["events"]["e"] for m in run(result.text, events)] == [[1]]


def test_readme_commands(tmp_path):
    """README's "Bring your Sigma rules" commands, in this process, on examples/sigma/."""
    from sigma_support import ROOT, vigil

    examples = ROOT / "examples" / "sigma"
    rules, events, out = tmp_path / "sigma.vigil", tmp_path / "events.jsonl", tmp_path / "o"
    assert vigil("import", "sigma", str(examples), stdout=rules)[0] == 0
    assert vigil("convert", "evtx-json", str(examples / "events.json"), "--streams-of",
                 str(rules), stdout=events)[0] == 0
    code, said = vigil("run", str(rules), "--events", str(events), "--engine", "embedded",
                       "--no-alerts", stdout=out)
    assert code == 0 and "0 bad" in said
    names = sorted(json.loads(line)["name"] for line in out.read_text().splitlines())
    assert names == ["logon_after_failures", "many_failed_logons", "whoami_all"]


def test_import_exit_codes_and_errors(tmp_path):
    from sigma_support import vigil

    bad_yaml, no_detection = tmp_path / "bad.yml", tmp_path / "nodet.yml"
    bad_yaml.write_text("title: x\n  bad: [\n")
    no_detection.write_text("title: x\nlogsource: {product: windows}\n")
    code, said = vigil("import", "sigma", str(bad_yaml), str(no_detection),
                       stdout=tmp_path / "out")
    assert code == 1
    assert f"{bad_yaml}: error: not a Sigma rule" in said
    assert said.count(f"{no_detection}: error: not a valid Sigma rule") == 1
    good = tmp_path / "good.yml"
    good.write_text(yaml.safe_dump({"title": "g", "logsource": WINDOWS,
                                    "detection": {"s": {"User": "x"}, "condition": "s"}}))
    code, said = vigil("import", "sigma", str(good), str(bad_yaml), stdout=tmp_path / "out")
    assert code == 0 and "1 declaration(s) from 2 file(s), 1 not imported" in said
    assert "rule good" in (tmp_path / "out").read_text()
