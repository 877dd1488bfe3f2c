"""replicad.session"""
