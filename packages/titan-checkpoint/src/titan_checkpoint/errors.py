"""What goes wrong with a checkpoint, as exception types a caller can tell apart."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded; the message names the folder or file and the cause."""


class CheckpointCorruptError(CheckpointError):
    """A file of a checkpoint is missing, truncated, or its bytes differ from what was written."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written for a different model (or state) than the one loading it."""


def raise_from_dcp(error: BaseException, context: str) -> None:
    """DCP wraps each rank's failure in a CheckpointException (a BaseException); surface ours by name."""
    if isinstance(error, CheckpointError):
        raise error
    for failure in getattr(error, "failures", {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, CheckpointError):
            raise inner from error
    raise CheckpointError(f"{context} ({type(error).__name__}: {error})") from error
