"""Errors the front end raises for programs it cannot place."""


class PlacementError(ValueError):
    """A placed-function call that cannot run where it is placed.

    The message names the Python call at fault (`name at file:line`): an
    unknown axis name, a sharding that does not divide a dimension, specs that
    do not match the arguments, or a value used on a slice it was not sent to.
    """
