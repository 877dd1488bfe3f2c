"""replicad.follower"""
