"""Errors users see. Messages name the argument, dimension, axis and sizes involved."""


class PartitionError(ValueError):
    """A schedule or input that cannot be partitioned as asked."""


class InputMismatchError(TypeError):
    """A partitioned callable called with arguments of another structure, shape or dtype."""


class UnevenOutputWarning(UserWarning):
    """A program output tiled unevenly, gathered and trimmed at the program's boundary
    (`partir.jit(..., uneven_outputs="replicate")`)."""


class EstimateWarning(UserWarning):
    """An estimate that leaves part of the step uncosted: ops the simulator has no cost for
    (charged their memory traffic only) or loops whose trip count it cannot read (counted
    once). The estimate is then a lower bound, and plans compared by it may rank wrong."""


class PluginError(RuntimeError):
    """Plugins that cannot be loaded together: a misspelled hook implementation, or two
    plugins contributing the same name (the message names both)."""


class UnknownNameError(PartitionError, KeyError):
    """A hardware spec, simulator or searcher name that no plugin registered. Both a
    PartitionError (a bad `partir.jit` argument) and a KeyError (a failed lookup)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""
