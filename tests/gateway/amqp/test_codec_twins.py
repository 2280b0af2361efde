"""The codec suites once more, under each twin of the hot paths in turn (pure and compiled).

A normal run tests whichever twin is in use (compiled after scripts/setup, pure under
MQGW_PURE_PYTHON=1); here every test of these suites runs against both, whatever the
environment says, so neither twin goes untested in one run. The tests are the suites' own
functions, collected again in this module under the ``twin`` fixture.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from gateway.amqp import deliver_frame, frame_reader, frame_writer, publish_cut
from storage import twins
from tests.gateway.amqp import (
    test_frame_reader,
    test_frame_writer,
    test_fuzz,
    test_publish_fast_path,
    test_sans_io,
)

SUITES = (test_frame_reader, test_frame_writer, test_publish_fast_path, test_fuzz, test_sans_io)

for _suite in SUITES:
    for _name, _test in vars(_suite).items():
        if _name.startswith("test_") and callable(_test):
            globals()[f"test_{_suite.__name__.rpartition('.')[2][5:]}__{_name[5:]}"] = _test


def _twin_of(pure: ModuleType, kind: str) -> ModuleType:
    if kind == "pure":
        return pure
    twin = twins.compiled_twin(pure)
    assert twin is not None, f"{pure.__name__}'s compiled twin is not built: scripts/setup"
    return twin


@pytest.fixture(autouse=True, params=["pure", "compiled"])
def twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    kind: str = request.param
    monkeypatch.setattr(frame_reader, "cut_publish", _twin_of(publish_cut, kind).cut_publish)
    monkeypatch.setattr(
        frame_writer, "deliver_one_write", _twin_of(deliver_frame, kind).deliver_one_write
    )
    return kind
