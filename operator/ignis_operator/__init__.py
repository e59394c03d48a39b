"""IgnisQueue operator (kopf): syncs IgnisQueue custom resources into queue-metadata records."""
