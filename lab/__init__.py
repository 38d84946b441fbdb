"""The repository's lab harness: tools for measuring mpca on this machine, not part of the installed package.

Nothing here ships in the wheel (``setup.cfg`` packages only ``mpca*``) and nothing in ``mpca`` imports it.
Run them from a checkout, at its root, as ``python -m lab.<name>``:

* ``lab.netcluster`` — an emulated cluster on one machine: network namespaces, rate-limited links (``tc``), a
  Spark standalone master and workers; runs a command inside it (root, ``ip`` and ``tc`` needed).  The
  command sees ``$MPCA_SPARK_MASTER`` and friends, the interface of :mod:`mpca.bench.emulated_cluster`;
  ``mpca bench compare --network`` re-runs itself inside it (as a process) when this checkout is at hand.
* ``lab.overlap`` — does a cycle's reduce overlap its broadcast on the wire (run inside ``lab.netcluster``).
* ``lab.longrun`` — driver and executor memory over thousands of exchange cycles.
* ``lab.faults`` — faults injected into a real run, and what they cost (the tests inject the same ones).
* ``lab.spill`` — an agent's samples/s with its partition on local disk against in memory.

Functions of these modules that Spark ships to executors (``lab.faults``) are pickled by value: executors
do not run in the checkout and cannot import ``lab``.
"""
