"""The suite's order of work (tests/conftest.py): units handed out longest first by the
seconds of tests/unit_seconds.txt, each group of SAME_WORKER one unit, and a run that
writes the file anew."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import (
    CLUSTER_AND_SPARK,
    SAME_WORKER,
    UNIT_SECONDS,
    UNLISTED_UNIT_S,
    longest_first,
    outside_their_peers_group,
    read_unit_seconds,
    work_unit,
    write_unit_seconds,
)


def test_a_group_is_one_unit_and_any_other_file_its_own() -> None:
    assert work_unit("tests/spark/test_follow.py::test_x[a]") == CLUSTER_AND_SPARK
    assert work_unit("tests/spark/test_plan.py::TestPlan::test_y") == CLUSTER_AND_SPARK
    assert work_unit("tests/mirror/test_mirror_kafka.py::test_m") == CLUSTER_AND_SPARK
    assert work_unit("tests/test_install.py::test_z") == "throw-away users"
    assert work_unit("tests/log/test_crash.py::test_kill") == "tests/log/test_crash.py"


def test_units_go_longest_first_and_unlisted_ones_as_a_short_unit() -> None:
    seconds = {"a.py": 3.0, "b.py": 90.0, "spark": 400.0, "c.py": 3.0}
    units = ["a.py", "new.py", "c.py", "b.py", "spark"]
    assert longest_first(units, seconds) == ["spark", "b.py", "new.py", "a.py", "c.py"]
    # timing-ok: the table's weights, a figure no clock gave here
    assert 3.0 < UNLISTED_UNIT_S < 90.0


def test_the_file_is_written_as_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "unit_seconds.txt"
    write_unit_seconds(path, {"tests/a.py": 1.04, "spark": 312.26})
    assert read_unit_seconds(path) == {"spark": 312.3, "tests/a.py": 1.0}
    assert path.read_text().splitlines()[-2:] == ["312.3 spark", "1.0 tests/a.py"]


def test_the_measured_file_names_every_group() -> None:
    """A unit it does not name counts as short: a group (the Spark tests, minutes) must be
    named. (A file it names that is gone only costs a line.)"""
    # timing-ok: a subset of the table's names, no duration
    assert set(SAME_WORKER.values()) <= set(read_unit_seconds(UNIT_SECONDS))


class _Item:
    def __init__(self, nodeid: str, *fixtures: str) -> None:
        self.nodeid = nodeid
        self.fixturenames = list(fixtures)


def test_a_file_of_a_shared_peer_outside_its_group_is_named() -> None:
    items = [
        _Item("tests/mirror/test_mirror_kafka.py::test_a", "kafka_cluster"),
        _Item("tests/spark/test_stream.py::test_b", "kafka_cluster", "spark"),
        _Item("tests/new/test_new.py::test_c", "tmp_path", "kafka_cluster"),
        _Item("tests/new/test_other.py::test_d", "kafka_broker"),
        _Item("tests/follower/test_tiered_kafka.py::test_e", "tiered_kafka_broker"),
        _Item("tests/new/test_third.py::test_f", "tiered_kafka_broker"),
    ]
    assert outside_their_peers_group(items) == {"tests/new/test_new.py", "tests/new/test_third.py"}
