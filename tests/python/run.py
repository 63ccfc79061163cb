"""ctest's entry to the Python API tests: pytest on this folder; exit 77 (skipped) without pytest."""
import os
import sys

try:
    import pytest
except ImportError:
    print("pytest is missing (Debian: python3-pytest): the Python API tests are skipped")
    sys.exit(77)

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", os.path.dirname(os.path.abspath(__file__))]))
