"""The one user-facing error type of the data pipeline."""


class DataError(Exception):
  """A problem with the user's data or data configuration.

  The message is a single line meant for the user (the CLI prints ``str(e)``
  without a traceback): it names the file, line, or numbers involved and,
  where there is one, the fix.
  """
