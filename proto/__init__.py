"""Wire definitions (.proto) and the Python code generated from them."""
