"""replicad.log"""
