"""The gRPC edge: the services a server answers (`services`), the guard every
call wears (`rpc`, `admission`, `limits`), protobuf ↔ domain conversion
(`wire`), the gRPC helper port (`peer`), the comparison data channel
(`datachannel`) and the metrics endpoint (`metrics`)."""
