"""Errors users see. Messages name the argument, dimension, axis and sizes involved."""


class PartitionError(ValueError):
    """A schedule or input that cannot be partitioned as asked."""


class InputMismatchError(TypeError):
    """A partitioned callable called with arguments of another structure, shape or dtype."""
