"""Storage adapters: the data directory, the keyring, object stores."""
