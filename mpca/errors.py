"""Exceptions.  :class:`UserError` and its subclasses are mistakes the user can fix: the CLI prints
their one-line message and exits with status 2, without a traceback."""


class MpcaError(RuntimeError):
    """Base class of mpca's errors."""


class UserError(MpcaError, ValueError):
    """Bad configuration, data, paths or cluster: one clear line saying what is wrong and how to fix it."""


class ClusterTooSmallError(UserError):
    """The cluster cannot host the requested agents plus their exchange tasks."""


class RunFailedError(MpcaError):
    """The run failed for a reason outside the user's configuration (an agent crashed, Spark failed)."""
