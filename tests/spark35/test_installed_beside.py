"""The second environment (``make test-spark35``): pyspark 3.5 was installed first, then mpca beside it."""
import os

import pytest


def test_installing_mpca_kept_the_environments_own_pyspark():
    expected = os.environ.get("MPCA_EXPECT_PYSPARK")
    if not expected:
        pytest.skip("not the second environment (make test-spark35 sets MPCA_EXPECT_PYSPARK)")
    import pyspark

    assert pyspark.__version__ == expected  # pip resolved mpca's pyspark>=3.5 without replacing it

