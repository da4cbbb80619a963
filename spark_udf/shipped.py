"""A processor shipped to the executors as bytes pickled once on the driver, and unpickled once
per Python worker rather than once per task.

Spark sends a Python UDF's closure with every task, and the stateful operator and the routing
step each run several tasks per micro-batch. A program's processor carries its compiled rules:
a program of 1,000 rules pickles to ~5 MB and takes ~1.3 s to unpickle, which every task of
every micro-batch paid. A :class:`ShippedProcessor` in its place is a digest and the bytes:
the bytes still travel with each task (copying them is cheap), but each worker process keeps
the processors it has built by digest and builds each once.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from typing import Any

from pyspark import cloudpickle

from cep.events.keyed import KeyedProcessor
from percolator.collector import keep_built

__all__ = ["ShippedProcessor", "shipped"]

#: Processors a worker process keeps built, newest last (a rerun with an edited program, or a
#: live program's versions, each bring their own).
_KEEP = 16
_BUILT: OrderedDict[str, KeyedProcessor] = OrderedDict()


class ShippedProcessor:
    """A zero-argument source of a processor (:data:`spark_udf.routing.ProcessorSource`): the
    processor's pickled bytes and their digest; calling it gives the processor, built once per
    process.

    Examples
    --------
    >>> from spark_udf.rules import processor_specs
    >>> (spec,), _ = processor_specs(
    ...     "stream txn (card string, amount float, ts timestamp) time ts\\n"
    ...     "rule big from txn by card pattern b define b as amount > 100\\n")
    >>> source = shipped(spec.processor)
    >>> source() is source() and source().rules[0].name == "big"
    True
    """

    __slots__ = ("digest", "blob")

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.digest = hashlib.blake2b(blob, digest_size=16).hexdigest()

    def __call__(self) -> KeyedProcessor:
        built = _BUILT.get(self.digest)
        if built is None:
            built = _BUILT[self.digest] = pickle.loads(self.blob)
            while len(_BUILT) > _KEEP:
                _BUILT.popitem(last=False)
            keep_built()  # the worker keeps it: out of the collector's full collections
        else:
            _BUILT.move_to_end(self.digest)
        return built

    def __getstate__(self) -> tuple[bytes, str]:
        return self.blob, self.digest

    def __setstate__(self, state: tuple[bytes, str]) -> None:
        self.blob, self.digest = state

    def __repr__(self) -> str:
        return f"ShippedProcessor({self.digest}, {len(self.blob):,} bytes)"


def shipped(processor: Any) -> ShippedProcessor:
    """``processor`` pickled (with Spark's cloudpickle, as a UDF's closure would be) into a
    :class:`ShippedProcessor`; the driver's own object is kept as the built one, so the driver
    does not unpickle it again."""
    source = ShippedProcessor(cloudpickle.dumps(processor))
    _BUILT[source.digest] = processor
    while len(_BUILT) > _KEEP:
        _BUILT.popitem(last=False)
    return source
