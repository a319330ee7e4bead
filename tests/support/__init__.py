"""Test-only helpers: a fault-injecting TCP proxy and private database server processes."""
