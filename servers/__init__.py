"""The leader and helper servers: one gRPC service implementation, two roles."""
