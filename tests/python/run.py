"""ctest's entry to the Python API tests: pytest on this folder; exit 77 (skipped) without pytest, or 1
when WOQ_REQUIRE_REFERENCES is set (tools/test.sh, CI: the suite must run, not skip)."""
import os
import sys

try:
    import pytest
except ImportError:
    required = os.environ.get("WOQ_REQUIRE_REFERENCES", "") not in ("", "0")
    print(f"pytest is missing from {sys.executable} (bash tools/install-deps.sh installs it): the Python API tests "
          + ("cannot run, and WOQ_REQUIRE_REFERENCES is set" if required else "are skipped"))
    sys.exit(1 if required else 77)

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", os.path.dirname(os.path.abspath(__file__))]))
