"""`ConfigError`: a user's configuration mistake, which the binary shows as one line (exit 2)."""


class ConfigError(ValueError, TypeError):
    """A bad setting, gin binding, flag, data shape or path, found before the first step.

    It is both a ValueError and a TypeError, the two kinds of mistake a setting can make. Only
    this exception is turned into one line by the runner and the binary: any other exception,
    from the user's own code included, keeps its traceback.
    """
