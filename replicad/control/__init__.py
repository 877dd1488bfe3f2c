"""Operations shell: sd_notify, the control socket (server and client), status rendering.

Nothing here imports the follower: the daemon hands these pieces a `snapshot()` callable
returning the status dict, and commands as async callables.
"""
