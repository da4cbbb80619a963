"""The pySigma backend in pySigma's convention: a rule in, the expected Vigil text out; one case
per modifier and condition form (tests/fixtures/sigma/backend_cases.yml), then the whole-file
output, names, severities, the mapping and the plugin's discovery."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sigma.collection import SigmaCollection

from query_lang import check_program
from query_lang.imports.sigma import LogSourceMap, VigilBackend, import_sigma
from query_lang.imports.sigma.importer import READING_POLICY

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sigma"
CASES = yaml.safe_load((FIXTURES / "backend_cases.yml").read_text(encoding="utf-8"))
MAPPING = LogSourceMap.load([str(FIXTURES / "mapping.yml")])
WINDOWS = {"product": "windows", "category": "process_creation"}


def convert(rule: dict, output_format: str = "conditions"):
    """Convert one rule (a dict); the output and the errors collected."""
    collection = SigmaCollection.from_yaml(
        yaml.safe_dump(rule, sort_keys=False), policy=READING_POLICY
    )
    backend = VigilBackend(collect_errors=True, mapping=MAPPING)
    return backend.convert(collection, output_format), [str(e) for _, e in backend.errors]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_backend_case(case):
    rule = {"title": "t", "logsource": case.get("logsource", WINDOWS),
            "detection": case["detection"]}
    out, errors = convert(rule)
    if "error" in case:
        assert out == [] and len(errors) == 1, (out, errors)
        assert case["error"] in errors[0]
    else:
        assert errors == []
        assert out == [case["expected"]]


@pytest.mark.parametrize("case", [c for c in CASES if "expected" in c],
                         ids=[c["name"] for c in CASES if "expected" in c])
def test_every_expected_condition_checks(case):
    """Each translation is valid Vigil: the whole-file output passes the checks."""
    rule = {"title": "t", "logsource": case.get("logsource", WINDOWS),
            "detection": case["detection"]}
    text, errors = convert(rule, "default")
    assert errors == []
    _, problems = check_program(text=text)
    assert problems == [], text


def test_whole_file_output():
    rule = {
        "title": "Whoami 'all'", "id": "5e2b8f1a-3c4d-4e5f-8a9b-0c1d2e3f4a5b",
        "status": "test", "author": "someone", "level": "informational",
        "references": ["https://example.com/a"], "falsepositives": ["admins"],
        "tags": ["attack.discovery", "attack.t1033"], "logsource": WINDOWS,
        "detection": {"sel": {"Image|endswith": "\\whoami.exe"}, "condition": "sel"},
    }
    text, errors = convert(rule, "default")
    assert errors == []
    assert text == '''# Imported from Sigma by `vigil import sigma`.

# Sigma log source product: windows, category: process_creation
stream windows_process_creation (
  event_time timestamp,
  Image string
) time event_time lateness 1m

# Sigma: Whoami 'all' (<text>)
# id 5e2b8f1a-3c4d-4e5f-8a9b-0c1d2e3f4a5b, status test, level informational, author someone
# reference: https://example.com/a
# false positive: admins
rule whoami__all_ "Whoami 'all'"
  from windows_process_creation
  pattern e
  define e as lower(Image) endswith "\\\\whoami.exe"
  severity low
  tags "attack.discovery", "attack.t1033"
'''


@pytest.mark.parametrize(("level", "severity"), [
    ("informational", "low"), ("low", "low"), ("medium", "medium"), ("high", "high"),
    ("critical", "critical"),
])
def test_level_becomes_severity(level, severity):
    rule = {"title": "t", "level": level, "logsource": WINDOWS,
            "detection": {"sel": {"User": "x"}, "condition": "sel"}}
    text, _ = convert(rule, "default")
    assert f"  severity {severity}\n" in text


def test_several_conditions_become_several_rules(tmp_path):
    path = tmp_path / "two.yml"
    path.write_text(yaml.safe_dump({
        "title": "t", "logsource": WINDOWS,
        "detection": {"a": {"User": "x"}, "b": {"User": "y"}, "condition": ["a", "b"]},
    }))
    result = import_sigma([str(path)])
    assert [b.name for b in result.blocks] == ["two_1", "two_2"]


def test_rules_of_one_stream_share_its_declaration(tmp_path):
    for name, field in (("one", "Image"), ("two", "CommandLine")):
        (tmp_path / f"{name}.yml").write_text(yaml.safe_dump({
            "title": name, "logsource": WINDOWS,
            "detection": {"sel": {field: "x"}, "condition": "sel"},
        }))
    result = import_sigma([str(tmp_path)])
    assert result.text.count("stream windows_process_creation (") == 1
    assert "  CommandLine string,\n  Image string\n" in result.text
    _, problems = check_program(text=result.text)
    assert problems == []


def test_errors_name_the_file_and_keep_the_other_rules(tmp_path):
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text(yaml.safe_dump({"title": "g", "logsource": WINDOWS,
                                    "detection": {"s": {"User": "x"}, "condition": "s"}}))
    bad.write_text(yaml.safe_dump({"title": "b", "logsource": WINDOWS,
                                   "detection": {"s": {"U|minute": 3}, "condition": "s"}}))
    result = import_sigma([str(tmp_path)])
    assert [b.name for b in result.blocks] == ["good"]
    assert len(result.errors) == 1
    assert result.errors[0].file == str(bad)
    assert "time-part modifier |minute" in result.errors[0].message


def test_unmapped_log_source_is_named_after_its_parts():
    mapping = LogSourceMap.default()
    assert mapping.stream_for(("aws", None, "cloudtrail")).name == "aws_cloudtrail"
    assert mapping.stream_for((None, "proxy", None)).name == "proxy"
    assert mapping.stream_for(("gcp", None, "gcp.audit")).name == "gcp_gcp_audit"


def test_mapping_overrides_an_entry(tmp_path):
    override = tmp_path / "m.yml"
    override.write_text(
        "streams:\n  - {logsource: {product: windows, category: process_creation}, "
        "stream: procs, fields: {ProcessId: int}}\n"
    )
    mapping = LogSourceMap.load([str(override)])
    spec = mapping.stream_for(("windows", "process_creation", None))
    assert (spec.name, spec.field_type("ProcessId"), spec.evtx) == ("procs", "int", ())


def test_sigma_cli_discovers_the_backend():
    """pySigma finds `sigma.backends.vigil` (installed from query_lang/imports/sigma_plugin by
    pyproject.toml's package mapping) under the identifier `vigil`: what `sigma convert -t
    vigil` looks up. Run on the plugin's directory, as a regular install lays it out."""
    root = Path(__file__).resolve().parents[2]
    plugin_root = root / "query_lang" / "imports" / "sigma_plugin"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_root), str(root)])}
    code = ("from sigma.plugins import InstalledSigmaPlugins as P;"
            "b = P.autodiscover().backends; print(b['vigil'].__name__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "VigilBackend"
