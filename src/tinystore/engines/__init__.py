"""The engines: plain objects with methods, no sockets. The server and the embedded store both call them."""
