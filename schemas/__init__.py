"""The Avro contract between relay and sender (one record per .avsc file) and its codec; both
roles import it, and it imports neither."""
