"""mpca: coordinated asynchronous training of PyTorch models on Apache Spark (MPCA SGD and its baselines).

    from mpca import Trainer
    result = Trainer(model_fn, loss_fn, optimizer_fn, agents=2, input_shape=(1, 8, 8),
                     algorithm="mpca").fit(df)        # or "sync", "easgd", "diloco", "ddp", "single"
"""
from mpca.errors import ClusterTooSmallError, MpcaError, RunFailedError, UserError

__version__ = "0.1.0"

_ALGORITHM = ("AgentRule", "Algorithm", "AlphaSchedule", "BetaSchedule", "DriverRule", "GammaSchedule", "MPCAHyper",
              "algorithm_names", "register")


def __getattr__(name):
    """Imported on first use: the algorithms pull in torch, the Trainer Spark, the settings pydantic.  ``import
    mpca.data.synthetic`` (numpy alone), run by the executors that generate the teacher task's rows, and the
    commands that need none of them stay free of a torch import (~2 s of CPU per Python worker)."""
    if name in _ALGORITHM:
        from mpca import algorithm

        return getattr(algorithm, name)
    if name in ("Trainer", "FitResult"):
        from mpca import trainer

        return getattr(trainer, name)
    if name == "RunObserver":
        from mpca import observers

        return observers.RunObserver
    if name in ("Settings", "load_config"):
        from mpca import config

        return getattr(config, name)
    raise AttributeError(name)


__all__ = ["AgentRule", "Algorithm", "AlphaSchedule", "BetaSchedule", "ClusterTooSmallError", "DriverRule",
           "FitResult", "GammaSchedule", "MPCAHyper", "MpcaError", "RunFailedError", "RunObserver", "Settings", "Trainer",
           "UserError", "algorithm_names", "load_config", "register"]
