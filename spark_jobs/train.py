"""spark-submit entry point.

    spark-submit --master yarn --py-files mpca.zip spark_jobs/train.py --config conf/digits.yaml cluster.master=existing

Uses the session spark-submit created (``cluster.master`` is forced to
``existing``); everything else is as for ``mpca train``.
"""
import sys

from mpca.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a.startswith("cluster.master=") for a in argv):
        argv.append("cluster.master=existing")
    sys.exit(main(["train", *argv]))
