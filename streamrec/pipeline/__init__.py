"""The read pipeline: shards -> byte streams -> records -> the consumer."""
