"""replicad.protocol"""
