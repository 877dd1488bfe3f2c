"""Exit codes of the `replicad` commands: sysexits(3) where one fits, so systemd, shells and
monitoring tell a bad config from a missing directory from a crash."""

EX_OK = 0
EX_FAILURE = 1  # the daemon stopped on an error it logged (e.g. serve: could not listen)
EX_USAGE = 64
EX_OSERR = 71
EX_CANTCREAT = 73  # a path that must be created or written cannot be
EX_NOPERM = 77  # a path exists but may not be used by this user
EX_CONFIG = 78  # the configuration is invalid
EX_INTERRUPTED = 130  # SIGINT outside the daemon's own handling (128 + 2)
