"""The SDK: the client, its typed results, the consumer helpers and the large-payload gateway."""
