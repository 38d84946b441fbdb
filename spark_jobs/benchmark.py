"""spark-submit entry points for the benchmarks.

    spark-submit spark_jobs/benchmark.py compare [--algorithms mpca,sync ...]   # time to accuracy (mpca.bench.compare)
    spark-submit spark_jobs/benchmark.py exchange [...]                         # runtime (mpca.bench.exchange)
"""
import sys

if __name__ == "__main__":
    which, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 and sys.argv[1] in ("compare", "exchange") \
        else ("exchange", sys.argv[1:])
    if which == "compare":
        from mpca.bench.compare import main
    else:
        from mpca.bench.exchange import main
    sys.exit(main(rest))
