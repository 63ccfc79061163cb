"""Fixtures shared by the Python API tests: the bundled model loaded as sym_int4 (the default) and as fp32."""
import os

import pytest

import woq

MODEL = os.path.join(os.environ["WOQ_SOURCE"], "assets", "models", "stories260K")


@pytest.fixture(scope="module")
def model():
    return woq.optimize_model(MODEL, progress=False)


@pytest.fixture(scope="module")
def fp32():
    return woq.optimize_model(MODEL, low_bit="fp32", progress=False)
