"""The errors of a Hugging Face checkpoint that cannot be imported exactly: one line each, naming the
file, tensor or config field at fault (ValueErrors, so that a command line reports them in one line)."""


class HFError(ValueError):
  """A checkpoint folder that cannot be read: a missing or malformed file, a missing or misshapen tensor."""


class HFConfigError(HFError):
  """A `config.json` field whose value s3r does not compute exactly (the message names the field and its value)."""
