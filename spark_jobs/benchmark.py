"""spark-submit entry point for the runtime benchmark (local-cluster inside; see mpca/bench/exchange.py)."""
import sys

from mpca.bench.exchange import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
