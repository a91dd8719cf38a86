"""The service: the partition processor runtime, the embedded service (`keyload run`), the Kafka
service, the catch-up ticker, the doorbell and halt records."""
