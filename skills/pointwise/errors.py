"""The one way the pointwise template says no."""


class Unsupported(Exception):
    """The template cannot take this task; the message is the reason `supports` returns."""
