"""Replay tests share one SparkSession (local[2], loopback only, no UI): Spark starts slowly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from replay.spark import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session("local[2]", app="mqgw-replay-tests")
    yield session
    session.stop()
