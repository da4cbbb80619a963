"""``on_timer`` and ``close`` have one home (:class:`cep.events.keyed.KeyedProcessorBase`), which
both keyed processors use: a timer or the end of input is a call without events at a later
watermark."""

from __future__ import annotations

from cep.events.keyed import KeyedProcessorBase, ProcessResult
from cep.events.watermark import END_OF_INPUT
from cep.metrics import MetricProcessor
from cep.nfa.processor import RuleProcessor


def test_both_processors_take_on_timer_and_close_from_the_base() -> None:
    for processor in (RuleProcessor, MetricProcessor):
        assert issubclass(processor, KeyedProcessorBase)
        assert processor.on_timer is KeyedProcessorBase.on_timer
        assert processor.close is KeyedProcessorBase.close


class Recorder(KeyedProcessorBase):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def process(self, key, state, events, watermark_ms) -> ProcessResult:
        self.calls.append((key, state, tuple(events), watermark_ms))
        return ProcessResult(state=state)


def test_a_timer_advances_to_the_later_of_timer_and_watermark_and_close_to_the_end() -> None:
    recorder = Recorder()
    recorder.on_timer(("k",), b"s", 100, 90)
    recorder.on_timer(("k",), b"s", 100, 120)
    recorder.close(("k",), None)
    assert recorder.calls == [
        (("k",), b"s", (), 100), (("k",), b"s", (), 120), (("k",), None, (), END_OF_INPUT)
    ]
