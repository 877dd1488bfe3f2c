"""replicad.records"""
