"""mpca: coordinated asynchronous training of PyTorch models on Apache Spark (MPCA SGD).

    from mpca import Trainer
    result = Trainer(model_fn, loss_fn, optimizer_fn, agents=2, input_shape=(1, 8, 8)).fit(df)
"""
from mpca.algorithm import AlphaSchedule, BetaSchedule, GammaSchedule, MPCAHyper
from mpca.errors import ClusterTooSmallError, MpcaError, RunFailedError, UserError

__version__ = "0.1.0"


def __getattr__(name):  # the Trainer pulls in Spark; import it lazily
    if name in ("Trainer", "FitResult"):
        from mpca import trainer

        return getattr(trainer, name)
    raise AttributeError(name)


__all__ = ["AlphaSchedule", "BetaSchedule", "ClusterTooSmallError", "FitResult", "GammaSchedule", "MPCAHyper",
           "MpcaError", "RunFailedError", "Trainer", "UserError"]
