"""The wire protocol: frames, handshake and message bodies. Sans-I/O: bytes in, events out, bytes to send."""
