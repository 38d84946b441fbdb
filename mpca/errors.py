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


def error_line(e: BaseException, limit: int = 300) -> str:
    """One informative line of ``e``: for a Java exception through Py4J ("An error occurred while calling
    o12.load." then the Java trace) the Java exception's own message, else the first line."""
    import re

    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    for line in lines:
        m = re.match(r"^:?\s*(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error)):\s*(.+)$", line)
        if m:
            return f"{m.group(1)}: {m.group(2)}"[:limit]
    return lines[0][:limit] if lines else type(e).__name__
