"""The pySigma backend for Vigil: Sigma rules in, Vigil rules (and, for correlation rules,
metrics and sequence rules) out.

``sigma convert -t vigil rules/`` (with ``sigma-cli``) and ``vigil import sigma`` both go
through :class:`VigilBackend`; its default output is a whole Vigil file: the streams the rules
read, declared with the fields they use, then one block per rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sigma.conditions import (
    ConditionAND,
    ConditionFieldEqualsValueExpression,
    ConditionNOT,
    ConditionOR,
    ConditionValueExpression,
)
from sigma.conversion.base import TextQueryBackend
from sigma.conversion.state import ConversionState
from sigma.exceptions import SigmaError, SigmaFeatureNotSupportedByBackendError
from sigma.processing.conditions import LogsourceCondition
from sigma.processing.pipeline import ProcessingItem, ProcessingPipeline
from sigma.processing.transformations import (
    FieldMappingTransformation,
    ValueListPlaceholderTransformation,
)
from sigma.rule import SigmaRule
from sigma.types import (
    Placeholder,
    SigmaBool,
    SigmaCasedString,
    SigmaNumber,
    SigmaRegularExpressionFlag,
    SigmaString,
    SpecialChars,
)

from query_lang.imports.sigma import values as V
from query_lang.imports.sigma.correlations import correlation_blocks
from query_lang.imports.sigma.logsources import LogSourceMap, StreamSpec, vigil_name
from query_lang.imports.sigma.output import Block, Detection, render_file, rule_block

__all__ = ["VigilBackend", "vigil_pipeline"]

_FLAGS = {
    SigmaRegularExpressionFlag.IGNORECASE: "i",
    SigmaRegularExpressionFlag.MULTILINE: "m",
    SigmaRegularExpressionFlag.DOTALL: "s",
}


class _Placeholders(ValueListPlaceholderTransformation):
    """``%name%`` placeholders (``|expand``) replaced by the mapping's values, or refused with
    a message saying where the values go."""

    def placeholder_replacements(self, p: Placeholder) -> Any:
        if self._pipeline is None or p.name not in self._pipeline.vars:
            raise SigmaFeatureNotSupportedByBackendError(
                f"placeholder %{p.name}% (|expand) has no values: list them under "
                "`placeholders:` in the mapping"
            )
        return super().placeholder_replacements(p)


def vigil_pipeline(mapping: LogSourceMap) -> ProcessingPipeline:
    """The processing pipeline of a mapping: field renames per log source (the ``rename`` of a
    stream entry) and the values of ``%placeholders%`` for ``|expand``."""
    items = [ProcessingItem(_Placeholders(), identifier="vigil_placeholders")]
    for spec in mapping.streams:
        if spec.renames:
            product, category, service = spec.logsource
            items.append(ProcessingItem(
                FieldMappingTransformation(dict(spec.renames)),
                rule_conditions=[LogsourceCondition(
                    product=product, category=category, service=service
                )],
                identifier=f"vigil_fields_{spec.name}",
            ))
    return ProcessingPipeline(
        name="Vigil field mapping", priority=20, items=items,
        vars={name: list(values) for name, values in mapping.placeholders.items()},
    )


@dataclass
class _RuleContext:
    """What converting one rule's conditions gathers: its stream and the fields it reads."""

    rule: SigmaRule
    stream: StreamSpec
    fields: dict[str, str] = field(default_factory=dict)  # Vigil name -> Sigma name


class VigilBackend(TextQueryBackend):
    """Sigma rules as Vigil rules, following Sigma's matching semantics exactly or refusing.

    Parameters
    ----------
    processing_pipeline:
        A user pipeline applied after the backend's (pySigma's convention).
    collect_errors:
        Collect ``(rule, error)`` pairs in ``errors`` instead of raising.
    mapping:
        The log-source mapping (default: Vigil's ``logsources.yml``).

    Examples
    --------
    >>> from sigma.collection import SigmaCollection
    >>> rules = SigmaCollection.from_yaml('''
    ... title: Whoami
    ... id: 0b8d4d1c-9e6b-4d5e-8d52-3c8f4f1d2a10
    ... logsource: {product: windows, category: process_creation}
    ... detection:
    ...   selection: {Image|endswith: '\\\\whoami.exe'}
    ...   condition: selection
    ... level: high
    ... ''')
    >>> print(VigilBackend().convert(rules, "conditions")[0])
    lower(Image) endswith "\\\\whoami.exe"
    """

    name: ClassVar[str] = "Vigil"
    identifier: ClassVar[str] = "vigil"
    formats: ClassVar[dict[str, str]] = {
        "default": "A Vigil rule file: the streams, then a rule (or metric) per Sigma rule",
        "conditions": "Only the condition expression of each converted rule, one per line",
        "blocks": "The converted declarations as Python objects (vigil import sigma reads them)",
    }
    requires_pipeline: ClassVar[bool] = False

    precedence = (ConditionNOT, ConditionAND, ConditionOR)
    group_expression: ClassVar[str] = "({expr})"
    token_separator: str = " "
    or_token: ClassVar[str] = "or"
    and_token: ClassVar[str] = "and"
    not_token: ClassVar[str] = "not"
    eq_token: ClassVar[str] = " == "
    str_quote: ClassVar[str] = '"'
    escape_char: ClassVar[str] = "\\"
    wildcard_multi: ClassVar[str] = "*"
    wildcard_single: ClassVar[str] = "?"

    convert_or_as_in: ClassVar[bool] = True
    convert_and_as_in: ClassVar[bool] = False
    in_expressions_allow_wildcards: ClassVar[bool] = False

    correlation_methods: ClassVar[dict[str, str]] = {
        "default": "Vigil metrics (sliding windows) and sequence rules",
    }
    default_correlation_method: ClassVar[str] = "default"
    finalize_correlation_subqueries = True

    def __init__(
        self,
        processing_pipeline: ProcessingPipeline | None = None,
        collect_errors: bool = False,
        mapping: LogSourceMap | None = None,
        **backend_options: Any,
    ):
        super().__init__(processing_pipeline, collect_errors, **backend_options)
        self.mapping = mapping or LogSourceMap.default()
        self.backend_processing_pipeline = vigil_pipeline(self.mapping)
        self._context: _RuleContext | None = None
        self._names: dict[str, int] = {}

    # ------------------------------------------------------------------ rules

    def convert_rule(self, rule: SigmaRule, output_format: str | None = None,
                     callback: Any = None) -> list[Any]:
        with self._rule_context(rule):
            return super().convert_rule(rule, output_format, callback)

    @contextmanager
    def _rule_context(self, rule: SigmaRule) -> Iterator[None]:
        logsource = (rule.logsource.product, rule.logsource.category, rule.logsource.service)
        self._context = _RuleContext(rule, self.mapping.stream_for(logsource))
        try:
            yield
        finally:
            self._context = None

    def finish_query(self, rule: Any, query: Any, state: ConversionState) -> Any:
        context = self._require_context()
        return Detection(context.stream, str(query), dict(context.fields))

    def finalize_query(self, rule: Any, query: Any, index: int, state: ConversionState,
                       output_format: str) -> Any:
        if isinstance(query, Block):
            return query
        name = self._unique_name(rule, index, len(rule.detection.parsed_condition))
        return rule_block(rule, query, name, self.mapping)

    def finalize_output_default(self, queries: list[Any]) -> str:
        return render_file(queries, self.mapping)

    def finalize_output_blocks(self, queries: list[Any]) -> list[Block]:
        return list(queries)

    def finalize_output_conditions(self, queries: list[Any]) -> list[str]:
        return [block.detection.condition for block in queries if block.detection is not None]

    def _unique_name(self, rule: Any, index: int, count: int) -> str:
        if rule.name:  # Sigma's unique rule name, when the rule has one
            stem = rule.name
        elif rule.source is not None:
            stem = rule.source.path.stem
        else:
            stem = rule.title or "sigma_rule"
        base = vigil_name(str(stem)).lower()
        if count > 1:
            base = f"{base}_{index + 1}"
        seen = self._names.get(base, 0)
        self._names[base] = seen + 1
        return base if not seen else f"{base}_{seen + 1}"

    def _require_context(self) -> _RuleContext:
        if self._context is None:
            raise SigmaFeatureNotSupportedByBackendError("a condition outside of a Sigma rule")
        return self._context

    # ------------------------------------------------------------------ fields

    def _field(self, sigma_name: str, cond: Any) -> str:
        context = self._require_context()
        name = vigil_name(sigma_name)
        if name == self.mapping.time_field:
            raise self._unsupported(
                f"field {sigma_name!r} has the name of the time field the streams declare "
                f"({self.mapping.time_field}); rename it in the mapping", cond)
        known = context.fields.setdefault(name, sigma_name)
        if known != sigma_name:
            raise self._unsupported(
                f"fields {known!r} and {sigma_name!r} both become {name!r} in Vigil", cond)
        return name

    def _field_type(self, name: str) -> str:
        return self._require_context().stream.field_type(name)

    def _unsupported(self, what: str, cond: Any) -> SigmaFeatureNotSupportedByBackendError:
        return SigmaFeatureNotSupportedByBackendError(what, source=getattr(cond, "source", None))

    def escape_and_quote_field(self, field_name: str) -> str:
        return vigil_name(field_name)

    # ------------------------------------------------------------------ values

    def _parts(self, value: SigmaString, cond: Any) -> list[Any]:
        parts: list[Any] = []
        for part in value.s:
            if isinstance(part, str):
                parts.append(part)
            elif part is SpecialChars.WILDCARD_MULTI:
                parts.append(V.WILDCARD_MULTI)
            elif part is SpecialChars.WILDCARD_SINGLE:
                parts.append(V.WILDCARD_SINGLE)
            elif isinstance(part, Placeholder):
                raise self._unsupported(
                    f"placeholder %{part.name}% (|expand) has no value: give it under "
                    "`placeholders:` in the mapping", cond)
        return parts

    def _literal(self, value: SigmaString, cond: Any) -> str:
        """The text of a value without wildcards (to_plain() would write its escapes back)."""
        return "".join(part for part in self._parts(value, cond) if isinstance(part, str))

    def _string(self, cond: ConditionFieldEqualsValueExpression, cased: bool) -> str:
        name = self._field(cond.field, cond)
        value: SigmaString = cond.value
        kind = self._field_type(name)
        if kind in ("int", "float"):
            plain = None if value.contains_special() else self._literal(value, cond)
            number = _number(plain) if plain is not None else None
            if number is None:
                raise self._unsupported(
                    f"string {value.original!r} on field {cond.field!r}, which the stream "
                    f"declares {kind}", cond)
            return f"{name} == {V.number_literal(number)}"
        if kind == "bool":
            raise self._unsupported(
                f"string {value.original!r} on field {cond.field!r}, which the stream declares "
                "bool", cond)
        try:
            return V.string_match(name, self._parts(value, cond), cased=cased)
        except V.Untranslatable as err:
            raise self._unsupported(str(err), cond) from None

    def convert_condition_field_eq_val_str(self, cond, state):
        return self._string(cond, cased=False)

    def convert_condition_field_eq_val_str_case_sensitive(self, cond, state):
        return self._string(cond, cased=True)

    def convert_condition_as_in_expression(self, cond, state):
        first = cond.args[0]
        name = self._field(first.field, first)
        kind = self._field_type(name)
        if kind != "string":
            return self.convert_condition_or(cond, state)
        texts = []
        cased = {isinstance(arg.value, SigmaCasedString) for arg in cond.args}
        if len(cased) > 1:
            return self.convert_condition_or(cond, state)
        for arg in cond.args:
            value = arg.value
            if isinstance(value, SigmaNumber):
                texts.append(str(value.number))
            else:
                texts.append(self._literal(value, arg))
        return V.equals_any(name, texts, cased=cased.pop())

    def decide_convert_condition_as_in_expression(self, cond, state) -> bool:
        return (
            isinstance(cond, ConditionOR)
            and len(cond.args) > 1
            and super().decide_convert_condition_as_in_expression(cond, state)
        )

    def convert_condition_field_eq_val_num(self, cond, state):
        name = self._field(cond.field, cond)
        number = cond.value.number
        kind = self._field_type(name)
        if kind in ("int", "float"):
            return f"{name} == {V.number_literal(number)}"
        if kind == "bool":
            raise self._unsupported(
                f"number {number} on field {cond.field!r}, which the stream declares bool", cond)
        # A string field: the number compares as its decimal text (evtx numbers are text).
        return f"{name} == {V.string_literal(str(number))}"

    def convert_condition_field_eq_val_bool(self, cond, state):
        name = self._field(cond.field, cond)
        value: SigmaBool = cond.value
        kind = self._field_type(name)
        if kind == "bool":
            return f"{name} == {'true' if value.boolean else 'false'}"
        if kind == "string":
            return f'lower({name}) == "{"true" if value.boolean else "false"}"'
        raise self._unsupported(
            f"boolean on field {cond.field!r}, which the stream declares {kind}", cond)

    def convert_condition_field_eq_val_re(self, cond, state):
        name = self._string_field(cond, "|re")
        regex = cond.value
        flags = "".join(_FLAGS[f] for f in regex.flags)
        try:
            return V.regex_match(name, regex.regexp.to_plain(), flags)
        except V.Untranslatable as err:
            raise self._unsupported(str(err), cond) from None

    def convert_condition_field_eq_val_cidr(self, cond, state):
        name = self._string_field(cond, "|cidr")
        return V.cidr_match(name, str(cond.value.network))

    def convert_condition_field_compare_op_val(self, cond, state):
        name = self._field(cond.field, cond)
        kind = self._field_type(name)
        op = cond.value.op.name
        if kind not in ("int", "float"):
            raise self._unsupported(
                f"numeric comparison |{op.lower()} on field {cond.field!r}, which the stream "
                f"declares {kind}: declare it int or float under the stream's `fields` in "
                "the mapping", cond)
        return V.compare_number(name, op, cond.value.number.number)

    def convert_condition_field_eq_field(self, cond, state):
        name = self._string_field(cond, "|fieldref")
        ref = cond.value
        other = self._field(ref.field, cond)
        if self._field_type(other) != "string":
            raise self._unsupported(f"|fieldref to the non-string field {ref.field!r}", cond)
        return V.field_reference(
            name, other, starts=ref.starts_with, ends=ref.ends_with, cased=False
        )

    def convert_condition_field_eq_val_null(self, cond, state):
        return f"{self._field(cond.field, cond)} is null"

    def convert_condition_field_exists(self, cond, state):
        return f"{self._field(cond.field, cond)} is not null"

    def convert_condition_field_not_exists(self, cond, state):
        return f"{self._field(cond.field, cond)} is null"

    def convert_condition_field_eq_val_exists(self, cond, state):
        if cond.value:
            return self.convert_condition_field_exists(cond, state)
        return self.convert_condition_field_not_exists(cond, state)

    def convert_condition_field_eq_val_timestamp_part(self, cond, state):
        raise self._unsupported(
            f"time-part modifier |{cond.value.timestamp_part.name.lower()} on field "
            f"{cond.field!r} (Vigil has no calendar functions)", cond)

    def convert_condition_field_eq_query_expr(self, cond, state):
        raise self._unsupported("a query expression placeholder of a pipeline", cond)

    def convert_condition_query_expr(self, cond, state):
        raise self._unsupported("a query expression placeholder of a pipeline", cond)

    def _string_field(self, cond: Any, modifier: str) -> str:
        name = self._field(cond.field, cond)
        kind = self._field_type(name)
        if kind != "string":
            raise self._unsupported(
                f"{modifier} on field {cond.field!r}, which the stream declares {kind}", cond)
        return name

    # ------------------------------------------------------------------ keywords

    def _keywords_field(self, cond: ConditionValueExpression) -> str:
        stream = self._require_context().stream
        if stream.keywords is None:
            raise self._unsupported(
                f"keyword search (a value without a field) on stream {stream.name!r}, which "
                "has no `keywords` field in the mapping", cond)
        self._require_context().fields.setdefault(stream.keywords, stream.keywords)
        return stream.keywords

    def convert_condition_val_str(self, cond, state):
        name = self._keywords_field(cond)
        # A keyword matches anywhere in the text, as a full-text search does.
        parts = [V.WILDCARD_MULTI, *self._parts(cond.value, cond), V.WILDCARD_MULTI]
        return V.string_match(name, parts, cased=isinstance(cond.value, SigmaCasedString))

    def convert_condition_val_num(self, cond, state):
        name = self._keywords_field(cond)
        return V.string_match(
            name, [V.WILDCARD_MULTI, str(cond.value.number), V.WILDCARD_MULTI]
        )

    def convert_condition_val_re(self, cond, state):
        name = self._keywords_field(cond)
        regex = cond.value
        try:
            return V.regex_match(
                name, regex.regexp.to_plain(), "".join(_FLAGS[f] for f in regex.flags)
            )
        except V.Untranslatable as err:
            raise self._unsupported(str(err), cond) from None

    # ------------------------------------------------------------------ correlations

    def convert_correlation_rule(self, rule, output_format=None, method=None, callback=None):
        try:
            self.last_processing_pipeline.apply(rule)
            blocks = correlation_blocks(rule, self._unique_name(rule, 0, 1), self.mapping)
        except SigmaError as err:
            if not self.collect_errors:
                raise
            self.errors.append((rule, err))
            rule.set_conversion_result([])
            return []
        rule.set_conversion_result(blocks)
        return blocks if rule._output else []

    # The template-driven correlation methods of TextQueryBackend are replaced by
    # convert_correlation_rule; these stubs satisfy the abstract interface.
    def convert_correlation_event_count_rule(self, *args: Any, **kwargs: Any) -> list[Any]:
        raise NotImplementedError

    convert_correlation_value_count_rule = convert_correlation_event_count_rule
    convert_correlation_temporal_rule = convert_correlation_event_count_rule
    convert_correlation_temporal_ordered_rule = convert_correlation_event_count_rule


def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None
