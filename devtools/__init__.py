"""Development servers the project runs as child processes (a Kafka broker, an S3 server).

Not part of the product package: the wheel does not ship them; tests, benchmarks and scripts run
them from a checkout."""
