"""The archive: closed segments of the replica in S3-compatible object storage.

- `manifest`: object keys and the per-partition manifest (pure).
- `uploads`: what to upload next and when to retry (sans-I/O).
- `store`: the bucket, through boto3 (the one module that talks to it).
- `uploader`: the shell that uploads rolled segments off the event loop.
"""
