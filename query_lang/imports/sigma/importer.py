"""``vigil import sigma`` as a library call: Sigma rule files in, one Vigil file out, with an
error for each rule (or part of a rule) that has no faithful translation.

Each converted rule is checked on its own (with the streams it reads) before it is kept, so one
rule that Vigil refuses never costs the others; the error names its file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from sigma.collection import SigmaCollection
from sigma.exceptions import SigmaError, SigmaRuleLocation
from sigma.policy import default_policy
from sigma.policy.regex_engine import PythonRegexEngine

from query_lang.errors import VigilError
from query_lang.imports.sigma.backend import VigilBackend
from query_lang.imports.sigma.errors import SigmaImportError
from query_lang.imports.sigma.logsources import LogSourceMap
from query_lang.imports.sigma.output import Block, render_file
from query_lang.loader import check_program

__all__ = ["SigmaImport", "import_sigma", "sigma_rule_files"]

Validator = Callable[[str], Sequence[VigilError]]
"""Checks a Vigil program's text and returns its errors (the command line also compiles it)."""

SIGMA_SUFFIXES = (".yml", ".yaml")

READING_POLICY = dataclasses.replace(default_policy, regex_engine=PythonRegexEngine())
"""pySigma's reading policy with Python's regex engine: a regular expression RE2 refuses is
then read, and refused by the backend with an error that says why (Vigil's `matches` is RE2),
instead of failing the rule's parsing with RE2's log on stderr."""


@dataclass
class SigmaImport:
    """The outcome of importing Sigma rules.

    Attributes
    ----------
    text:
        The Vigil file: streams, then one block per imported rule.
    blocks:
        The imported declarations.
    errors:
        One error per rule (or correlation) that was not imported, naming file and construct.
    files:
        The rule files read.
    """

    text: str
    blocks: list[Block] = field(default_factory=list)
    errors: list[SigmaImportError] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def imported(self) -> int:
        """How many Vigil declarations were written (rules and metrics)."""
        return len(self.blocks)


def sigma_rule_files(paths: Iterable[str]) -> list[str]:
    """The files named: files as given, directories searched for ``*.yml``/``*.yaml``."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(
                str(p) for p in Path(path).rglob("*") if p.suffix in SIGMA_SUFFIXES and p.is_file()
            )
        else:
            found = [path]
        files.extend(f for f in found if f not in files)
    return files


def _check_text(text: str) -> Sequence[VigilError]:
    _, errors = check_program(text=text)
    return errors


def _location(error: SigmaError, rule: object, fallback: str) -> tuple[str, int]:
    source = getattr(error, "source", None) or getattr(rule, "source", None)
    if isinstance(source, SigmaRuleLocation):
        return str(source.path), source.line or 0
    return fallback, 0


def _message(error: BaseException) -> str:
    # A SigmaError's str() appends its location, which the error reports apart.
    first = error.args[0] if getattr(error, "args", None) else None
    text = str(first) if isinstance(first, str) else str(error)
    return " ".join(text.split())


def import_sigma(
    paths: Sequence[str],
    mapping: LogSourceMap | None = None,
    validate: Validator = _check_text,
) -> SigmaImport:
    """Import the Sigma rules of ``paths`` (files or directories).

    Parameters
    ----------
    paths:
        Rule files (``.yml``), or directories searched for them. Correlation rules find the
        rules they refer to among all the files given.
    mapping:
        The log-source mapping; default :meth:`LogSourceMap.default`.
    validate:
        Checks each converted rule with the streams it reads (default: ``check_program``).

    Examples
    --------
    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "whoami.yml"), "w") as f:
    ...     _ = f.write('''title: Whoami
    ... logsource: {product: windows, category: process_creation}
    ... detection:
    ...   selection: {Image|endswith: '\\\\whoami.exe'}
    ...   condition: selection
    ... level: high
    ... ''')
    >>> result = import_sigma([folder])
    >>> result.imported, result.errors
    (1, [])
    >>> print(result.blocks[0].text)  # doctest: +NORMALIZE_WHITESPACE
    # Sigma: Whoami (whoami.yml)
    # level high
    rule whoami "Whoami"
      from windows_process_creation
      pattern e
      define e as lower(Image) endswith "\\\\whoami.exe"
      severity high
    """
    mapping = mapping or LogSourceMap.default()
    files = sigma_rule_files(paths)
    errors: list[SigmaImportError] = []
    collections = []
    for path in files:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            errors.append(SigmaImportError(f"cannot read the rule file: {err}", path))
            continue
        try:
            collection = SigmaCollection.from_yaml(
                text, collect_errors=True, source=SigmaRuleLocation(path),
                resolve_references=False, policy=READING_POLICY,
            )
        except (SigmaError, ValueError, yaml.YAMLError) as err:  # not YAML at all
            errors.append(SigmaImportError(f"not a Sigma rule: {_message(err)}", path))
            continue
        collections.append(collection)
    merged = SigmaCollection.merge(collections, resolve_references=False)
    invalid = [(error, None) for error in merged.errors]
    invalid += [(rule.errors[0], rule) for rule in merged.rules if rule.errors]
    seen: set[tuple[str, str, int]] = set()
    for error, rule in invalid:  # pySigma lists a rule's error with the rule and the file
        where, line = _location(error, rule, "<sigma>")
        key = (_message(error), where, line)
        if key not in seen:
            seen.add(key)
            errors.append(SigmaImportError(f"not a valid Sigma rule: {key[0]}", where, line))
    valid = [rule for rule in merged.rules if not rule.errors]
    collection = SigmaCollection(valid, resolve_references=False)
    try:
        collection.resolve_rule_references()
    except SigmaError as err:
        where, line = _location(err, None, "<sigma>")
        errors.append(SigmaImportError(_message(err), where, line))
        collection = SigmaCollection(
            [r for r in valid if r.__class__.__name__ == "SigmaRule"], resolve_references=False
        )

    backend = VigilBackend(collect_errors=True, mapping=mapping)
    blocks: list[Block] = backend.convert(collection, "blocks")
    for rule, error in backend.errors:
        where, line = _location(error, rule, "<sigma>")
        errors.append(SigmaImportError(_message(error), where, line))

    kept: list[Block] = []
    for block in blocks:
        problems = validate(render_file([block], mapping))
        if problems:
            first = problems[0]
            errors.append(SigmaImportError(
                f"rule {block.name}: Vigil refuses the translation: {first.message}",
                block.origin or "<sigma>",
            ))
            continue
        kept.append(block)
    return SigmaImport(render_file(kept, mapping), kept, errors, files)
