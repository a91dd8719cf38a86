"""Work queues: resources, leases (receive, renew, ack, nack), message lifecycle, dead letters, state."""
