"""User-facing errors.

Anything raised as `UserError` is printed by the CLI as one line (``error: …``) with exit code 2,
never as a traceback. Raise it for bad input: wrong paths, malformed files, unknown words or keys.
"""


class UserError(Exception):
    """Bad input from the user; the message is shown as is, on one line."""
