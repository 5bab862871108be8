"""msgpack + zstd tensor transport."""
