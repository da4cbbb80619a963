"""A program's processors travel to the executors as bytes pickled once on the driver and are
built once per Python worker (``spark_udf.shipped``), not unpickled by every task."""

from __future__ import annotations

import pickle
import subprocess
import sys

import spark_udf.shipped as shipping
from spark_udf.rules import processor_specs, route_specs
from spark_udf.shipped import ShippedProcessor, shipped

PROGRAM = """
stream txn (card string, amount float, ts timestamp) time ts
rule big from txn by card pattern b define b as amount > 100
rule small_big from txn by card pattern s b define s as amount < 1, b as amount > 100
"""


def test_a_worker_builds_a_shipped_processor_once(monkeypatch):
    (spec,), _ = processor_specs(PROGRAM)
    source = shipped(spec.processor)
    assert source() is spec.processor  # the driver keeps its own
    # A worker: a fresh process has built nothing; every task brings the source again.
    monkeypatch.setattr(shipping, "_BUILT", type(shipping._BUILT)())
    loads = []
    real_loads = pickle.loads
    monkeypatch.setattr(shipping.pickle, "loads",
                        lambda blob: (blob == source.blob and loads.append(1)) or real_loads(blob))
    tasks = [pickle.loads(pickle.dumps(source)) for _ in range(5)]
    built = [task() for task in tasks]
    assert len(loads) == 1 and all(b is built[0] for b in built)
    assert [r.name for r in built[0].rules] == ["big", "small_big"]
    assert built[0] is not spec.processor
    event = {"stream": "txn", "card": "c", "amount": 500.0, "ts": 1_000, "_seq": 0}
    assert [m["name"] for m in built[0].process(("c",), None, [event], 5_000).outputs] == \
        [m["name"] for m in spec.processor.process(("c",), None, [event], 5_000).outputs]


def test_another_program_is_built_apart_and_a_worker_keeps_a_few():
    (one,), _ = processor_specs(PROGRAM)
    (other,), _ = processor_specs(PROGRAM.replace("> 100", "> 200"))
    a, b = shipped(one.processor), shipped(other.processor)
    assert a.digest != b.digest and a() is one.processor and b() is other.processor
    for _ in range(shipping._KEEP + 4):
        (spec,), _ = processor_specs(PROGRAM.replace("100", str(300 + _)))
        shipped(spec.processor)
    assert len(shipping._BUILT) == shipping._KEEP
    again = pickle.loads(pickle.dumps(a))()  # built again once forgotten
    assert [r.name for r in again.rules] == ["big", "small_big"]


def test_a_route_plan_ships_its_processors():
    specs, _ = processor_specs(PROGRAM)
    plan = route_specs({"_event": "string"}, specs)
    assert all(isinstance(source, ShippedProcessor) for _, source, _ in plan.entries)
    assert plan.entries[0][1]() is specs[0].processor


WORKER = """
import gc, weakref
import spark_udf.shipped as shipping
from spark_udf.rules import processor_specs
from spark_udf.shipped import ShippedProcessor, shipped

PROGRAM = {program!r}
(spec,), _ = processor_specs(PROGRAM)
blob = shipped(spec.processor).blob
shipping._BUILT.clear()  # a worker: it has built nothing
built = ShippedProcessor(blob)()
kept = {{id(o) for o in gc.get_objects()}}
# Built and kept: in no generation a collection looks at.
assert id(built) not in kept and id(built.rules[0]) not in kept, "not frozen"
assert gc.get_freeze_count() > 0
gone = weakref.ref(built)
built.itself = built  # a cycle through frozen objects: only the collector frees it
shipping._BUILT.clear()  # the worker no longer keeps it
del built
(other,), _ = processor_specs(PROGRAM.replace("> 100", "> 200"))
again = shipped(other.processor)  # the driver's own: nothing built, nothing frozen again
gc.collect()
assert gone() is not None  # frozen: held until the next build
shipping._BUILT.clear()
ShippedProcessor(again.blob)()  # the worker builds the next program
assert gone() is None, "a processor the worker no longer keeps stayed frozen"
print("ok")
"""


def test_a_worker_keeps_what_it_built_out_of_full_collections_but_not_for_good():
    # In a process of its own: freezing moves that whole process's heap.
    done = subprocess.run([sys.executable, "-c", WORKER.format(program=PROGRAM)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
