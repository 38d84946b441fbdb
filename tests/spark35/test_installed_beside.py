"""The second environment (``make test-spark35``): pyspark 3.5 was installed first, then mpca beside it."""
import os

import pytest


def test_installing_mpca_kept_the_environments_own_pyspark():
    expected = os.environ.get("MPCA_EXPECT_PYSPARK")
    if not expected:
        pytest.skip("not the second environment (make test-spark35 sets MPCA_EXPECT_PYSPARK)")
    import pyspark

    assert pyspark.__version__ == expected  # pip resolved mpca's pyspark>=3.5 without replacing it


def test_the_spark_4_apis_mpca_falls_back_from_are_absent_here():
    """On 3.5 the fallbacks of mpca.compat are what runs (DataFrame.toArrow, mapInArrow(profile=) are 4.0)."""
    import pyspark
    from pyspark.sql import DataFrame

    if not pyspark.__version__.startswith("3.5"):
        pytest.skip(f"pyspark {pyspark.__version__}: not the Spark 3.5 environment")
    assert not hasattr(DataFrame, "toArrow")
