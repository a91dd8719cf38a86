"""Subscription groups: checkpointed consumers of a topic, their deliveries and timers."""
