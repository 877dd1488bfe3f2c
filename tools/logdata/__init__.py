"""Test data for the log store: real producer batches and a crash-test writer."""
