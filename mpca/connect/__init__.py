"""Training from a Spark Connect session (Databricks standard and serverless compute, any ``sc://`` client):
the run's driver side as a coordinator task inside the cluster (:mod:`mpca.connect.coordinator`), started and
followed by the client (:mod:`mpca.connect.client`); ``Trainer.fit`` chooses it for a Connect session."""
