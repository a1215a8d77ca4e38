"""A server's durable state: the interface and its pure rules (`rules`), the
stores that implement it (`sqlite`, `postgres`), their schemas, the choice of
store from a `--db` value (`opener`) and the one-main-process lock (`mainlock`).
Nothing here knows gRPC or protobuf."""
