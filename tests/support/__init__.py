"""Test-only helpers: a fault-injecting TCP proxy, private database server processes, the
console script as a process, and an in-memory ticket source."""
