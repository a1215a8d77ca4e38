"""Client side: per-user embeddings, encoding, sharing and upload to both servers."""
