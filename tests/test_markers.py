"""The fast suite cannot start a process, a server or a browser by accident."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import conftest


class _Test:
    """What the rules read of a collected test: its id, markers and fixtures."""

    def __init__(self, nodeid: str, markers=(), fixturenames=()):
        self.nodeid = nodeid
        self.fixturenames = list(fixturenames)
        self.keywords = dict.fromkeys(markers, True)
        self._markers = set(markers)
        self.stash = pytest.Stash()

    def get_closest_marker(self, name):
        return getattr(pytest.mark, name).mark if name in self._markers else None

    def add_marker(self, marker):
        self._markers.add(marker.name)


def test_an_unmarked_test_using_a_server_fixture_is_refused_at_collection(pytestconfig):
    items = [
        _Test("tests/test_x.py::test_fast", fixturenames=["client"]),
        _Test("tests/test_x.py::test_serves", fixturenames=["live_server"]),
        _Test("tests/test_x.py::test_marked", ["slow"], ["subprocess_env"]),
        _Test("tests/test_x.py::test_clicks", ["browser"], ["page"]),
    ]
    with pytest.raises(pytest.UsageError) as refused:
        conftest.pytest_collection_modifyitems(pytestconfig, items)
    assert "test_serves (uses live_server)" in str(refused.value)
    assert "test_fast" not in str(refused.value)
    assert "test_marked" not in str(refused.value)
    assert "test_clicks" not in str(refused.value)


@pytest.fixture
def running_as(monkeypatch):
    """Make the process rule see a stand-in test instead of this one."""

    def run_as(item):
        monkeypatch.setitem(conftest._running, "item", item)
        return item

    return run_as


def test_an_unmarked_test_that_starts_a_process_fails(running_as):
    unmarked = running_as(_Test("tests/test_x.py::test_spawns"))
    with pytest.raises(RuntimeError, match="test_spawns started a process"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    # Teardown fails it even if the code under test swallowed the error.
    assert "without @pytest.mark.slow" in unmarked.stash[conftest._UNMARKED]


def test_a_marked_test_may_start_one(running_as):
    running_as(_Test("tests/test_x.py::test_spawns", markers=["slow"]))
    assert subprocess.run([sys.executable, "-c", "pass"], check=False).returncode == 0


def test_the_preview_renderer_and_tmpfs_mounts_are_allowed_in_the_fast_suite(
    running_as, tmp_path
):
    running_as(_Test("tests/test_x.py::test_previews"))
    script = tmp_path / "render_worker.py"
    script.write_text("pass\n")
    assert subprocess.run([sys.executable, str(script)], check=False).returncode == 0
