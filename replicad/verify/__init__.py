"""`replicad verify --against-source`: the replica compared with its source, batch by batch."""
