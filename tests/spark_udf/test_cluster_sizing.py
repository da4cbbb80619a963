"""Sizing a new checkpoint from the cluster's cores, the refusal of a local-only checkpoint on
a cluster whose executors run elsewhere, and what ``vigil pack`` puts in its archive (the
cluster itself: ``test_cluster.py``)."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

import spark_udf.cluster as cluster
from cep.cli.pack import _package_files, editable_packages
from spark_udf.errors import CheckpointError
from spark_udf.run import run_spark

PROGRAM = """
stream txn (card_id string, amount float, ts timestamp) time ts
rule big from txn by card_id pattern b define b as amount > 100
"""


@pytest.mark.parametrize(("cores", "partitions", "buckets"),
                         [(1, 4, 16), (2, 4, 16), (8, 8, 16), (12, 12, 24), (64, 64, 128)])
def test_a_new_checkpoint_is_sized_from_the_cores(cores, partitions, buckets):
    assert cluster.partitions_for(cores) == partitions
    assert cluster.buckets_for(cluster.partitions_for(cores)) == buckets


def _cluster_session(driver_host: str) -> SimpleNamespace:
    conf = SimpleNamespace(get=lambda key, default=None: (
        driver_host if key == "spark.driver.host" else default))
    managers = [SimpleNamespace(host=driver_host, port=7079),
                SimpleNamespace(host="10.0.0.7", port=7079)]
    tracker = SimpleNamespace(getExecutorInfos=lambda: managers)
    return SimpleNamespace(conf=SimpleNamespace(set=lambda key, value: None),
                           sparkContext=SimpleNamespace(
        master="spark://10.0.0.1:7077", getConf=lambda: conf, defaultParallelism=2,
        statusTracker=lambda: tracker))


def test_a_local_checkpoint_is_refused_when_executors_run_on_other_hosts(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(cluster, "executor_hosts", lambda spark: ["10.0.0.7", "10.0.0.8"])
    events = tmp_path / "events.jsonl"
    events.write_text('{"card_id": "c1", "amount": 500, "ts": "2026-01-01T00:00:00Z"}\n')
    spark = _cluster_session("10.0.0.1")
    with pytest.raises(CheckpointError) as raised:
        run_spark(PROGRAM, str(events), out=str(tmp_path / "out"), spark=spark)
    message = str(raised.value)
    assert "is on this machine's disk" in message and "10.0.0.7, 10.0.0.8" in message
    assert "hdfs://" in message
    # Shared storage passes the check (the query is never started here).
    cluster.check_shared_checkpoint(spark, "hdfs://namenode/vigil/checkpoint")
    cluster.check_shared_checkpoint(spark, "s3a://bucket/vigil/checkpoint")


def test_executor_hosts_leave_the_driver_out():
    assert cluster.executor_hosts(_cluster_session("10.0.0.1")) == ["10.0.0.7"]


def test_executors_on_the_driver_host_may_use_a_local_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(cluster, "executor_hosts", lambda spark: ["127.0.0.1", "10.0.0.1"])
    cluster.check_shared_checkpoint(_cluster_session("10.0.0.1"), str(tmp_path / "ckpt"))


def test_a_network_filesystem_counts_as_shared():
    assert cluster.local_only_problem("/mnt/shared/c", "a", ["b"], "nfs4") is None
    assert cluster.local_only_problem("file:/data/c", "a", ["b"], "xfs") is not None


def test_pack_lays_an_editable_install_out_as_a_regular_one():
    packages = editable_packages(sys.prefix)
    if not packages:
        pytest.skip("Vigil is not an editable install here: the archive packs it as it is")
    assert {"cep", "query_lang", "percolator", "sketches", "spark_udf"} <= set(packages)
    site = os.path.join("lib", f"python{sys.version_info.major}.{sys.version_info.minor}",
                        "site-packages")
    targets = {f.target for f in _package_files(packages, site)}
    assert os.path.join(site, "spark_udf", "__init__.py") in targets
    assert os.path.join(site, "query_lang", "vigil.lark") in targets  # package data
    assert not any("__pycache__" in target for target in targets)
