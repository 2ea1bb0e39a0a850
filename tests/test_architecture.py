"""The architecture is a contract: import-linter checks it (`make lint`, `make test-all`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_import_points_down_and_no_app_imports_in_a_circle():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is part of the test extra: pip install -e '.[test]'"

    proc = subprocess.run(
        [lint, "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
