"""The one memory pool both daemons hold what peers send them to: its rules (`rules.py`,
sans-I/O) and the asyncio queue its shells wait in (`waiting.py`). The follower's shell
(replicad/follower/memory_pool.py) lends fetch-response buffers from it; serve's
(replicad/leader/request_pool.py) counts large request frames against it."""
