"""Readers: one module per external source format, each returning a ReadResult."""
