"""PySpark data pipeline: export, replay and backlog analytics over queue data."""
