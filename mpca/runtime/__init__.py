"""The Spark runtime around the pure algorithm layer (:mod:`mpca.algorithm`): cluster checks and sessions,
long-lived agents and their channel, the exchange tasks and the record they return, the 3-phase pipeline with
its roster of agents and its broadcasts, the parameter service and the timeline of every cycle
(ARCHITECTURE.md has the map)."""
