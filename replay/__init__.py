"""Migration tooling: capture traffic, replay it paced and in order on Spark, reconcile.

- Spark data sources (``pyspark.sql.datasource``, Arrow batches), registered by
  ``replay.spark.register_sources``: ``rabbitmq-trace`` (the rabbitmq_tracing plugin's JSON
  log), ``firehose`` (Parquet written by ``mqgw replay capture``) and ``mqgw-log`` (mqgw's
  own commitlog segments, readable while the node runs).
- ``replay.run.run_replay``: send a capture to a target, paced, per-order-key in order.
- ``replay.reconcile.reconcile``: compare what arrived in the target's log with the capture.

docs/migration.md is the walkthrough.
"""
