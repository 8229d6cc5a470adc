"""One module per worker RPC."""
