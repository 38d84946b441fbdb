"""The Spark runtime around the pure algorithm layer (:mod:`mpca.algorithm`): cluster checks and sessions,
long-lived agents and their channel, the exchange tasks, the 3-phase pipeline, the parameter service and the
timeline of every cycle."""
