"""RocksDB projections: the state the processors rebuild from the log."""
