"""Secure-computation layer: the ring and fixed-point encoding, additive sharing,
oblivious transfer, half-gates garbling and the SVT comparison circuits."""
